/**
 * The receipts' metric families (CONTRACT.md, "Route receipts"): counts kept in plain fields per
 * endpoint and upstream, and read into prom-client's families when the registry is scraped, so
 * that a receipt costs additions, not prom-client's label hashing. Routers on one registry and
 * prefix share the families, each adding its own counts; a closed router's counts stay.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import type { KvOutcome } from './verdict';

export const KV_OUTCOMES: readonly KvOutcome[] = ['confirmed', 'elsewhere', 'unseen', 'cached'];
export type TokenSource = 'predicted' | 'reported';
const SOURCES: readonly TokenSource[] = ['predicted', 'reported'];

/** One endpoint's counts: receipts by outcome ({@link KV_OUTCOMES} order), cached tokens by source. */
export class EndpointCounts {
  readonly outcomes = new Float64Array(KV_OUTCOMES.length);
  readonly tokens = new Float64Array(SOURCES.length);
  constructor(
    readonly upstream: string,
    readonly rank: string,
  ) {}
}

/** What one router reports at scrape time. */
export interface CountsSource {
  /** Every configured endpoint's counts. */
  endpoints(): Iterable<EndpointCounts>;
  /** Per upstream: 1 while its rank header is taken as honoured, else 0. */
  honoured(): Iterable<readonly [string, number]>;
}

interface Shared {
  readonly sources: Set<CountsSource>;
  /** Counts of closed routers, by label key. */
  readonly retired: Map<string, EndpointCounts>;
}

const shared = new WeakMap<object, Shared>();

/** A router's membership in the families: `leave()` when it closes. */
export interface ReceiptFamilies {
  leave(): void;
}

/** Joins (or creates) the three families on `registry` with `source`. */
export function joinReceiptFamilies(registry: Registry, prefix: string, source: CountsSource): ReceiptFamilies {
  const receiptsName = `${prefix}route_receipts_total`;
  const existing = registry.getSingleMetric(receiptsName);
  let state = existing === undefined ? undefined : shared.get(existing);
  // Registered by something else (another copy of this package): this router's counts are not exported.
  if (existing !== undefined && state === undefined) return { leave: () => undefined };
  if (state === undefined) {
    const made: Shared = { sources: new Set(), retired: new Map() };
    state = made;
    const every = (visit: (counts: EndpointCounts) => void) => {
      for (const one of made.sources) for (const counts of one.endpoints()) visit(counts);
      made.retired.forEach(visit);
    };
    const receipts = new Counter({
      name: receiptsName,
      help: "Route receipts of exactly routed requests, by what the engines' KV events showed: the prompt's new blocks on the rank chosen (confirmed), on another rank (elsewhere), on none in time (unseen), or nothing new to store (cached).",
      labelNames: ['upstream', 'rank', 'outcome'],
      registers: [registry],
      collect() {
        this.reset();
        every((counts) => KV_OUTCOMES.forEach((outcome, at) => this.inc({ upstream: counts.upstream, rank: counts.rank, outcome }, counts.outcomes[at])));
      },
    });
    new Counter({
      name: `${prefix}prompt_cached_tokens_total`,
      help: 'Prompt tokens served from the prefix cache, as the router predicted them and as the engine reported them (usage.prompt_tokens_details.cached_tokens), over the same requests.',
      labelNames: ['upstream', 'rank', 'source'],
      registers: [registry],
      collect() {
        this.reset();
        every((counts) => SOURCES.forEach((source, at) => this.inc({ upstream: counts.upstream, rank: counts.rank, source }, counts.tokens[at])));
      },
    });
    new Gauge({
      name: `${prefix}upstream_rank_honoured`,
      help: 'Whether route receipts show the upstream honouring the rank header (1), or not (0: the router lets vLLM balance its requests until probes are honoured again).',
      labelNames: ['upstream'],
      registers: [registry],
      collect() {
        this.reset();
        const values = new Map<string, number>();
        for (const one of made.sources) for (const [upstream, value] of one.honoured()) values.set(upstream, Math.min(value, values.get(upstream) ?? 1));
        values.forEach((value, upstream) => this.set({ upstream }, value));
      },
    });
    shared.set(receipts, made);
  }
  const members = state;
  members.sources.add(source);
  return {
    leave() {
      if (!members.sources.delete(source)) return;
      for (const counts of source.endpoints()) {
        const key = `${counts.upstream}\u0000${counts.rank}`;
        let kept = members.retired.get(key);
        if (kept === undefined) members.retired.set(key, (kept = new EndpointCounts(counts.upstream, counts.rank)));
        counts.outcomes.forEach((value, at) => (kept!.outcomes[at] += value));
        counts.tokens.forEach((value, at) => (kept!.tokens[at] += value));
      }
    },
  };
}
