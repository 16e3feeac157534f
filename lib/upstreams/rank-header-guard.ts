import type { RouterLogger } from '../observe/logger';
import type { RankHeaderEvidence, RouterMetrics } from '../observe/metrics';
import type { EndpointTable, RouteEndpoint } from './endpoints';
import { enginesProblem, outOfRangeProblem } from './rank-header-check';
import { reachedAlike, type UpstreamConfig } from './upstream-options';

interface Contradiction {
  /** The configuration it was found for: a changed one starts afresh. */
  readonly config: UpstreamConfig;
  /** What said so; the upstream is balanced by vLLM while any does. */
  readonly evidence: Set<RankHeaderEvidence>;
  /** The messages logged already, each once. */
  readonly logged: Set<string>;
}

/**
 * Acts on a server contradicting how the router reaches its ranks (rank-header-check.ts): each
 * contradiction is counted (`rank_header_rejections_total{upstream, evidence}`), logged once at
 * error level with its fix, and the upstream's requests go as vLLM balances them (no rank
 * claimed, no header: `EndpointTable.letVllmBalance`) rather than answered 400 one after another
 * or pinned to the wrong engine. An upstream whose configuration changes (`setUpstreams()`,
 * discovery) is honoured again; one the `/metrics` spoke against, also once its `/metrics`
 * agree. An out-of-range answer holds until the configuration changes.
 */
export class RankHeaderGuard {
  private readonly contradictions = new Map<string, Contradiction>();

  constructor(
    private readonly table: EndpointTable,
    private readonly metrics: Pick<RouterMetrics, 'rankHeaderRejected'>,
    private readonly logger: RouterLogger,
  ) {}

  /** The upstream answered that `endpoint`'s header value is out of `[0, numRanks)`. */
  refused(endpoint: RouteEndpoint, sent: number, numRanks: number): void {
    this.metrics.rankHeaderRejected(endpoint.upstream, 'answer');
    const config = this.current(endpoint.upstream);
    // An answer to a configuration replaced since says nothing about the new one.
    if (config === undefined || !reachedAlike(endpoint.config, config)) return;
    this.contradicted(config, 'answer', outOfRangeProblem(config, endpoint.rank, sent, numRanks));
  }

  /** A read of the upstream's `/metrics` named these engines (global ranks, ascending). */
  engines(upstream: UpstreamConfig, engines: readonly number[]): void {
    const problem = enginesProblem(upstream, engines);
    if (problem !== undefined) {
      this.metrics.rankHeaderRejected(upstream.name, 'metrics');
      this.contradicted(upstream, 'metrics', problem);
      return;
    }
    const known = this.contradictions.get(upstream.name);
    if (known === undefined) return;
    // Reached otherwise now: the table honours it again already.
    if (!reachedAlike(known.config, upstream)) this.contradictions.delete(upstream.name);
    else if (!known.evidence.delete('metrics') || known.evidence.size > 0) return;
    if (this.table.letVllmBalance(upstream.name, false)) {
      this.logger.info({ dpRouter: { upstream: upstream.name } }, `express-dp-router: upstream '${upstream.name}': its /metrics agree with its configuration again; claiming ranks there again.`);
    }
  }

  private contradicted(config: UpstreamConfig, evidence: RankHeaderEvidence, problem: string): void {
    let known = this.contradictions.get(config.name);
    if (known === undefined || !reachedAlike(known.config, config)) {
      known = { config, evidence: new Set(), logged: new Set() };
      this.contradictions.set(config.name, known);
    }
    known.evidence.add(evidence);
    this.table.letVllmBalance(config.name, true);
    if (known.logged.has(problem)) return;
    known.logged.add(problem);
    this.logger.error(
      { dpRouter: { upstream: config.name, evidence } },
      `express-dp-router: upstream '${config.name}' does not take the rank header the router sends it: ${problem}. Until then its requests go without one, as vLLM balances them.`,
    );
  }

  private current(name: string): UpstreamConfig | undefined {
    return this.table.upstreams.find((upstream) => upstream.name === name);
  }
}
