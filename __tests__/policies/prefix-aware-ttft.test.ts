import { describe, expect, it } from '@jest/globals';
import { prefixAware } from '../../lib/policies/prefix-aware';
import { PrefillCostModel } from '../../lib/policies/prefix-aware-ttft';
import type { Endpoint, PickContext } from '../../lib/types';

/** An endpoint with the first-token totals a measuring router feeds the policy. */
type Measured = { -readonly [K in keyof Endpoint]: Endpoint[K] } & { firstTokens: number; firstTokenSeconds: number };

function endpoints(count: number, inflight = 0): Measured[] {
  return Array.from({ length: count }, (_, rank) => ({
    key: `gpu#${rank}`,
    upstream: 'gpu',
    rank,
    inflight,
    load: inflight,
    healthy: true,
    firstTokens: 0,
    firstTokenSeconds: 0,
  }));
}

const ctx = (prompt: string): PickContext => ({ path: '/v1/completions', affinityKey: undefined, prompt });
const text = (seed: string, blocks: number): string => `${seed}:`.padEnd(64, '.').repeat(blocks);

describe('prefixAware: predicted time to first token', () => {
  it('leaves a cached prefix whose rank has a long prefill queue, and comes back once it has answered', () => {
    const policy = prefixAware();
    // Every candidate equally loaded: only the queued prefill tells them apart.
    const candidates = endpoints(4, 8);
    const system = text('system', 8);
    const home = policy.pick(candidates, ctx(system + text('q0', 1)));
    // Three long documents sent there (the only candidate), their prefill not answered yet.
    for (let i = 0; i < 3; i++) policy.pick([home], ctx(text(`doc ${i}`, 60)));
    // 180 blocks wait there: a question saves 8 blocks by going home, but would wait behind them.
    expect(policy.pick(candidates, ctx(system + text('q1', 1)))).not.toBe(home);
    // The router measured their first tokens: nothing waits any more, and the cache wins again.
    const answered = home as Measured;
    answered.firstTokens += 4;
    answered.firstTokenSeconds += 1;
    expect(policy.pick(candidates, ctx(system + text('q2', 1)))).toBe(home);
  });

  it('counts a request as waiting until it leaves in-flight when first tokens are not reported', () => {
    const policy = prefixAware();
    const candidates = endpoints(3, 4).map(({ firstTokens, firstTokenSeconds, ...plain }) => plain);
    const system = text('system', 8);
    const home = policy.pick(candidates, ctx(system + text('q0', 1)));
    for (let i = 0; i < 3; i++) policy.pick([home], ctx(text(`doc ${i}`, 60)));
    const away = policy.pick(candidates, ctx(system + text('q1', 1)));
    expect(away).not.toBe(home);
    // They finished: in-flight fell below the queue's length.
    for (const candidate of candidates) Object.assign(candidate, { inflight: 0, load: 0 });
    const other = candidates.find((c) => c !== home && c !== away)!;
    expect(policy.pick([home, other], ctx(system + text('q2', 1)))).toBe(home);
  });

  it('places a new prefix past its first choice when that queue is more than placementSlack prompts longer', () => {
    const place = (placementSlack: number): { busy: Endpoint; placed: Endpoint } => {
      const policy = prefixAware({ placementSlack });
      const candidates = endpoints(4, 4);
      const busy = candidates[1];
      for (let i = 0; i < 3; i++) policy.pick([busy], ctx(text(`doc ${i}`, 40)));
      // A new 10-block prefix whose rendezvous order puts `busy` first (as an idle instance places it).
      let prompt = '';
      for (let i = 0; prompt === ''; i++) {
        const candidate = text(`new ${i}`, 10);
        if (prefixAware().pick(endpoints(4), ctx(candidate)).key === busy.key) prompt = candidate;
      }
      return { busy, placed: policy.pick(candidates, ctx(prompt)) };
    };
    const tight = place(1);
    expect(tight.placed).not.toBe(tight.busy);
    const loose = place(1000);
    expect(loose.placed).toBe(loose.busy);
  });
});

describe('PrefillCostModel', () => {
  it('learns seconds per block and blocks per unit of load from first-token samples', () => {
    const model = new PrefillCostModel();
    expect(model.blocksPerLoad()).toBe(0);
    let seed = 1;
    const next = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
    for (let i = 0; i < 400; i++) {
      const blocks = 10 + 200 * next();
      const load = Math.floor(8 * next());
      model.learn(blocks, load, 1, 0.002 * blocks + 0.05 * load + 0.01);
    }
    expect(model.blocksPerLoad()).toBeCloseTo(25, 0);
    expect(model.secondsPerBlock).toBeCloseTo(0.002, 4);
  });

  it('keeps its prior until it has enough samples, and ignores nonsense', () => {
    const model = new PrefillCostModel();
    for (let i = 0; i < 10; i++) model.learn(100, 4, 1, 1);
    model.learn(100, 4, 1, Number.NaN);
    model.learn(100, 4, 0, 1);
    expect(model.blocksPerLoad()).toBe(0);
    expect(model.samples).toBe(10);
  });
});
