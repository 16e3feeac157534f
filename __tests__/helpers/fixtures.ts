import type { Options } from '../../lib';

/** The seed scenario: an 8-rank server `node-a` at `url` of which ranks 0, 2, 4, 6 are routed to. */
export function seedScenario(url: string, extra: Partial<Options> = {}): Options {
  return { upstreams: [{ url, name: 'node-a', dataParallelSize: 8, ranks: [0, 2, 4, 6] }], ...extra };
}
