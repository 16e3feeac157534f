/**
 * The verdict book: the one place where evidence becomes a verdict that changes how an upstream
 * is served for every client (CONTRACT.md, "Evidence that changes routing for everyone").
 *
 * - Client traffic raises a suspicion, kept per upstream and verdict by source
 *   ({@link Suspicion}); it takes the verdict only once `verdicts.minSources` distinct sources
 *   agree, each source's share capped, so that one client can at most delay a verdict.
 * - The router's own confirmation (a probe it builds itself) takes it whatever the sources.
 *
 * Each outcome is counted in `dp_router_verdicts_total{upstream, verdict, outcome}`; a verdict
 * taken is logged once with its evidence, a refusal once per upstream and verdict until one is taken.
 */
import { Counter } from 'prom-client';
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import type { RouterLogger } from '../observe/logger';
import type { MetricsConfig } from '../observe/metrics';
import { family } from '../observe/metric-family';
import type { VerdictsConfig } from './options';
import { evidenceSource } from './source';

/**
 * The verdicts that change routing for everyone, the closed label set of `verdict`:
 *
 * - `rank_header`: the upstream refuses the rank header the router sends (vLLM's out-of-range error);
 * - `elsewhere`: route receipts find its requests' blocks on other ranks (the header not honoured);
 * - `misses`: its exact index predicts cache hits the engine does not report;
 * - `tokens`: the engine counts other prompt tokens than the router's tokenizer;
 * - `tokenizer`: its `/tokenize` disagrees with the router's tokenizer;
 * - `ejection`: an endpoint ejected for failures a request can provoke (5xx, timeouts, resets).
 */
export type VerdictKind = 'rank_header' | 'elsewhere' | 'misses' | 'tokens' | 'tokenizer' | 'ejection';
export const VERDICT_KINDS: readonly VerdictKind[] = ['rank_header', 'elsewhere', 'misses', 'tokens', 'tokenizer', 'ejection'];
/** `taken`: the verdict now holds; `refused_single_source`: the evidence came from too few sources (or a probe contradicted it). */
export type VerdictOutcome = 'taken' | 'refused_single_source';
const OUTCOMES: readonly VerdictOutcome[] = ['taken', 'refused_single_source'];

/** The most sources one suspicion remembers: enough to tell `minSources` apart (at most 64), never a map a client can grow. */
const MAX_SOURCES = 64;

/** The sources behind one suspicion, each with how much evidence it brought. */
export class Suspicion {
  private readonly counts = new Map<string, number>();

  /** Evidence from `source`. */
  add(source: string): void {
    const known = this.counts.get(source);
    if (known !== undefined) this.counts.set(source, known + 1);
    else if (this.counts.size < MAX_SOURCES) this.counts.set(source, 1);
  }

  /** Distinct sources. */
  get sources(): number {
    return this.counts.size;
  }

  /** The evidence counted with each source's share capped at `cap`. */
  weight(cap: number): number {
    let total = 0;
    for (const count of this.counts.values()) total += Math.min(count, cap);
    return total;
  }

  clear(): void {
    this.counts.clear();
  }
}

/** How a verdict was reached, for its log line. */
export type VerdictBasis = 'probe' | 'sources';

export class Verdicts {
  readonly minSources: number;
  private readonly counter: Counter | undefined;
  /** The upstreams whose series are exported. */
  private tracked = new Set<string>();
  /** `upstream\nverdict` of refusals logged since the last verdict taken there. */
  private readonly refusalsTold = new Set<string>();

  constructor(
    config: VerdictsConfig,
    metrics: MetricsConfig | undefined,
    private readonly logger: Pick<RouterLogger, 'info' | 'warn'>,
  ) {
    this.minSources = config.minSources;
    if (metrics === undefined) return;
    const name = `${metrics.prefix}verdicts_total`;
    this.counter = family(
      metrics.registry,
      name,
      Counter,
      () =>
        new Counter({
          name,
          help: 'Verdicts that change routing for every client of an upstream, by outcome: taken (on the router\'s own probe, or agreeing evidence from verdicts.minSources distinct sources) or refused_single_source (client evidence from too few sources, or contradicted by a probe).',
          labelNames: ['upstream', 'verdict', 'outcome'],
          registers: [metrics.registry],
        }),
    );
  }

  /** The source of a request's evidence (see source.ts); `tenant` as admission resolved it. */
  sourceOf(req: IncomingMessage, headers: IncomingHttpHeaders, tenant: string | undefined): string {
    return evidenceSource(req, headers, tenant);
  }

  /** Zero series for each configured upstream (names from configuration only); none left for one removed. */
  track(upstreams: readonly string[]): void {
    const counter = this.counter;
    if (counter === undefined) return;
    const wanted = new Set(upstreams);
    for (const upstream of this.tracked) {
      if (wanted.has(upstream)) continue;
      for (const verdict of VERDICT_KINDS) for (const outcome of OUTCOMES) counter.remove({ upstream, verdict, outcome });
    }
    this.tracked = wanted;
    for (const upstream of upstreams) for (const verdict of VERDICT_KINDS) for (const outcome of OUTCOMES) counter.inc({ upstream, verdict, outcome }, 0);
  }

  /** Whether client evidence from `sources` distinct sources is enough. */
  enough(sources: number): boolean {
    return sources >= this.minSources;
  }

  /** A verdict was taken on `basis`: counted, and logged once with its evidence. */
  taken(upstream: string, verdict: VerdictKind, basis: VerdictBasis, evidence: Readonly<Record<string, unknown>>): void {
    this.counter?.inc({ upstream, verdict, outcome: 'taken' });
    this.refusalsTold.delete(`${upstream}\n${verdict}`);
    const by = basis === 'probe' ? "the router's own probe" : `evidence from ${String(evidence.sources)} distinct sources`;
    this.logger.info({ dpRouter: { upstream, verdict, basis, evidence } }, `express-dp-router: upstream '${upstream}': verdict '${verdict}' taken on ${by}.`);
  }

  /** Client evidence for a verdict was not enough (too few sources, or a probe said otherwise): counted, logged once until the verdict is taken. */
  refused(upstream: string, verdict: VerdictKind, evidence: Readonly<Record<string, unknown>>): void {
    this.counter?.inc({ upstream, verdict, outcome: 'refused_single_source' });
    const key = `${upstream}\n${verdict}`;
    if (this.refusalsTold.has(key)) return;
    this.refusalsTold.add(key);
    const sources = typeof evidence.sources === 'number' ? `${evidence.sources} source${evidence.sources === 1 ? '' : 's'}` : 'a client';
    this.logger.warn(
      `express-dp-router: upstream '${upstream}': evidence for verdict '${verdict}' from ${sources} was not taken (it needs the router's own probe, or ${this.minSources} distinct sources: verdicts.minSources); routing for everyone is unchanged.`,
    );
  }
}

/** Verdicts with the defaults and no metrics or logs: for parts built alone (tests, benches). */
export function quietVerdicts(minSources = 3): Verdicts {
  return new Verdicts({ minSources }, undefined, { info: () => undefined, warn: () => undefined });
}
