import { Counter, Gauge, type Registry } from 'prom-client';
import type { KvEventType, KvGapOutcome } from './events/subscriber';

// The KV-event metric families of exact routing (exact-routing.ts): counters per endpoint, and
// gauges read at scrape time from every router sharing the registry and prefix.

const KV_EVENT_TYPES: readonly KvEventType[] = ['stored', 'removed', 'cleared', 'invalid'];
const GAP_OUTCOMES: readonly KvGapOutcome[] = ['replayed', 'lost'];

/** What the metrics read of an upstream's stream: its endpoints' labels. */
export interface LabelledStream {
  readonly labels: Map<number, { upstream: string; rank: string }>;
}

/** What a router reports at scrape time. */
export interface KvGaugeReport {
  /** `blocks` the GPU index holds for the endpoint (also `kv_blocks{medium="GPU"}`). */
  rank(labels: { upstream: string; rank: string }, blocks: number, fresh: boolean): void;
  /** Blocks a lower tier holds for the endpoint (`kv_blocks{medium}`; `medium` from a closed set, tier-index.ts). */
  tier(labels: { upstream: string; rank: string }, medium: string, blocks: number): void;
  agreement(compared: number, ratio: number | undefined): void;
}

export interface KvMetrics {
  readonly events: Counter;
  readonly gaps: Counter;
  readonly sources: Set<(report: KvGaugeReport) => void>;
  track(stream: LabelledStream): void;
  forget(stream: LabelledStream): void;
}

/**
 * Gauges are read at scrape time; routers sharing a registry and prefix share the families,
 * each adding its own source.
 */
const kvSources = new WeakMap<object, Set<(report: KvGaugeReport) => void>>();

/** Creates (or joins) the KV-event metric families on `registry`. */
export function createKvMetrics(registry: Registry, prefix: string): KvMetrics {
  const events = counter(registry, `${prefix}kv_events_total`, 'KV-cache events received from the engines, by endpoint and type.', ['upstream', 'rank', 'type']);
  const gaps = counter(registry, `${prefix}kv_event_gaps_total`, 'Gaps in an engine\'s KV-event sequence, by whether a replay closed them.', ['upstream', 'rank', 'outcome']);
  const blocksName = `${prefix}kv_index_blocks`;
  let sources: Set<(report: KvGaugeReport) => void> | undefined;
  const existing = registry.getSingleMetric(blocksName);
  if (existing !== undefined) sources = kvSources.get(existing);
  if (sources === undefined) {
    const shared = new Set<(report: KvGaugeReport) => void>();
    sources = shared;
    // Each family's collect gathers all three, so that a scrape of any one is current.
    const gather = (): void => {
      blocks.reset();
      fresh.reset();
      byMedium.reset();
      let compared = 0;
      let agreed = 0;
      const report: KvGaugeReport = {
        rank(labels, held, isFresh) {
          blocks.set(labels, held);
          fresh.set(labels, isFresh ? 1 : 0);
          byMedium.set({ ...labels, medium: 'GPU' }, held);
          // Every configured endpoint shows its CPU tier, at 0 until the connector offloads.
          byMedium.inc({ ...labels, medium: 'CPU' }, 0);
        },
        tier(labels, medium, held) {
          byMedium.set({ ...labels, medium }, held);
        },
        agreement(count, share) {
          compared += count;
          agreed += count * (share ?? 1);
        },
      };
      for (const source of shared) source(report);
      ratio.set(compared === 0 ? 1 : agreed / compared);
    };
    const blocks = new Gauge({ name: blocksName, help: 'Blocks the exact prefix index holds, by endpoint.', labelNames: ['upstream', 'rank'], registers: [registry], collect: gather });
    const fresh = new Gauge({
      name: `${prefix}kv_stream_fresh`,
      help: "Whether the endpoint is routed on the exact prefix index (1): its KV-event stream is fresh and the tokenizer agrees with the upstream's.",
      labelNames: ['upstream', 'rank'],
      registers: [registry],
      collect: gather,
    });
    const ratio = new Gauge({
      name: `${prefix}tokenizer_agreement_ratio`,
      help: "Share of sampled requests whose tokens matched the upstream's /tokenize (1 before any sample).",
      registers: [registry],
      collect: gather,
    });
    const byMedium = new Gauge({ name: `${prefix}kv_blocks`, help: 'Blocks the exact prefix index holds, by endpoint and KV-cache tier (GPU, and the media a KV connector offloads to).', labelNames: ['upstream', 'rank', 'medium'], registers: [registry], collect: gather });
    kvSources.set(blocks, shared);
  }
  const per = (stream: LabelledStream, work: (labels: { upstream: string; rank: string }) => void) => stream.labels.forEach(work);
  return {
    events,
    gaps,
    sources,
    track: (stream) =>
      per(stream, (labels) => {
        for (const type of KV_EVENT_TYPES) events.inc({ ...labels, type }, 0);
        for (const outcome of GAP_OUTCOMES) gaps.inc({ ...labels, outcome }, 0);
      }),
    forget: (stream) =>
      per(stream, (labels) => {
        for (const type of KV_EVENT_TYPES) events.remove({ ...labels, type });
        for (const outcome of GAP_OUTCOMES) gaps.remove({ ...labels, outcome });
      }),
  };
}

function counter(registry: Registry, name: string, help: string, labelNames: string[]): Counter {
  const existing = registry.getSingleMetric(name);
  if (existing instanceof Counter) return existing;
  return new Counter({ name, help, labelNames, registers: [registry] });
}
