import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import type { RouterLogger } from '../observe/logger';
import type { RankHeaderEvidence, RouterMetrics } from '../observe/metrics';
import { Suspicion, type Verdicts } from '../verdicts/verdicts';
import type { EndpointTable, RouteEndpoint } from './endpoints';
import { enginesProblem, outOfRangeProblem } from './rank-header-check';
import { probeRankHeader, type ProbeOutcome } from './rank-probe';
import { reachedAlike, type UpstreamConfig } from './upstream-options';

interface Contradiction {
  /** The configuration it was found for: a changed one starts afresh. */
  readonly config: UpstreamConfig;
  /** What said so; the upstream is balanced by vLLM while any does. */
  readonly evidence: Set<RankHeaderEvidence>;
  /** The messages logged already, each once. */
  readonly logged: Set<string>;
  /** The header value vLLM refused (evidence `answer`): probed again now and then until it is taken. */
  refusedValue: string | undefined;
  /** When the next of those probes is due (ms, the guard's clock). */
  nextProbe: number;
  probing: boolean;
}

/** Refusals of one upstream's header not yet a verdict: who sent the requests refused, and whether a probe is out. */
interface Suspected {
  readonly config: UpstreamConfig;
  readonly suspicion: Suspicion;
  probing: boolean;
}

/** What the guard works with. */
export interface RankHeaderGuardParts {
  readonly table: EndpointTable;
  readonly metrics: Pick<RouterMetrics, 'rankHeaderRejected'>;
  readonly logger: RouterLogger;
  readonly verdicts: Verdicts;
  /** The outgoing rank header's name. */
  readonly header: string;
  /** Least time between two probes of a refused value while its verdict holds. Default: 10,000 ms. */
  readonly liftEveryMs?: number;
  /** The clock. Default: `Date.now`. */
  readonly now?: () => number;
}

/**
 * Acts on a server contradicting how the router reaches its ranks (rank-header-check.ts): each
 * contradiction is counted (`rank_header_rejections_total{upstream, evidence}`), logged once at
 * error level with its fix, and the upstream's requests go as vLLM balances them (no rank
 * claimed, no header: `EndpointTable.letVllmBalance`) rather than answered 400 one after another
 * or pinned to the wrong engine.
 *
 * An answer is evidence only as a verdict allows (lib/verdicts): vLLM's own error for the very
 * value that request carried raises a suspicion, which the router confirms with a probe of its
 * own (the same value on a 1-token request it builds: rank-probe.ts), or which agreeing answers
 * to `verdicts.minSources` distinct sources take when no probe can decide. While the verdict
 * holds, a probe now and then (at most every `liftEveryMs`, on the credentials of a request
 * passing through) lifts it once the value is taken again. One the `/metrics` spoke against is
 * honoured again once its `/metrics` agree; any upstream whose configuration changes
 * (`setUpstreams()`, discovery), at once.
 */
export class RankHeaderGuard {
  private readonly contradictions = new Map<string, Contradiction>();
  private readonly suspected = new Map<string, Suspected>();
  private readonly table: EndpointTable;
  private readonly metrics: Pick<RouterMetrics, 'rankHeaderRejected'>;
  private readonly logger: RouterLogger;
  private readonly verdicts: Verdicts;
  private readonly header: string;
  private readonly liftEveryMs: number;
  private readonly now: () => number;
  /** Refused values held: while none is, an answer costs one comparison. */
  private held = 0;
  private closed = false;

  constructor(parts: RankHeaderGuardParts) {
    this.table = parts.table;
    this.metrics = parts.metrics;
    this.logger = parts.logger;
    this.verdicts = parts.verdicts;
    this.header = parts.header;
    this.liftEveryMs = parts.liftEveryMs ?? 10_000;
    this.now = parts.now ?? Date.now;
  }

  /**
   * The upstream answered, in vLLM's own words, that header value `sent` is out of
   * `[0, numRanks)`, to a request `req` sent to `endpoint` (`headers`: its headers; `tenant`: as
   * admission resolved it).
   */
  refused(endpoint: RouteEndpoint, sent: number, numRanks: number, req: IncomingMessage, headers: IncomingHttpHeaders, tenant: string | undefined): void {
    const value = endpoint.headerValue;
    // The rank in the sentence must be the one the router sent on this request: an echo of a
    // client's text names another, or the right one on a request that carried no header.
    if (value === undefined || String(sent) !== value) return;
    this.metrics.rankHeaderRejected(endpoint.upstream, 'answer');
    const config = this.current(endpoint.upstream);
    // An answer to a configuration replaced since says nothing about the new one.
    if (this.closed || config === undefined || !reachedAlike(endpoint.config, config)) return;
    if (this.contradictions.get(config.name)?.refusedValue !== undefined) return;
    let suspected = this.suspected.get(config.name);
    if (suspected === undefined || !reachedAlike(suspected.config, config)) {
      suspected = { config, suspicion: new Suspicion(), probing: false };
      this.suspected.set(config.name, suspected);
    }
    suspected.suspicion.add(this.verdicts.sourceOf(req, headers, tenant));
    if (suspected.probing) return;
    suspected.probing = true;
    const taken = suspected;
    void probeRankHeader(config.url, this.header, value, headers).then((outcome) => this.probed(taken, endpoint, value, numRanks, outcome));
  }

  /** An answer from `endpoint`'s upstream: while a refused value is held there, now and then the probe that may lift it. */
  answered(endpoint: RouteEndpoint, headers: IncomingHttpHeaders): void {
    if (this.held === 0) return;
    const known = this.contradictions.get(endpoint.upstream);
    const value = known?.refusedValue;
    if (known === undefined || value === undefined || known.probing || this.closed) return;
    if (!reachedAlike(known.config, endpoint.config)) {
      // Reconfigured: the table honours it again already, and this value was another configuration's.
      this.forget(endpoint.upstream);
      return;
    }
    const now = this.now();
    if (now < known.nextProbe) return;
    known.probing = true;
    known.nextProbe = now + this.liftEveryMs;
    void probeRankHeader(known.config.url, this.header, value, headers).then((outcome) => {
      known.probing = false;
      if (outcome === 'honoured' && this.contradictions.get(known.config.name) === known && known.refusedValue === value) this.lift(known);
    });
  }

  /** A read of the upstream's `/metrics` named these engines (global ranks, ascending). */
  engines(upstream: UpstreamConfig, engines: readonly number[]): void {
    const problem = enginesProblem(upstream, engines);
    if (problem !== undefined) {
      this.metrics.rankHeaderRejected(upstream.name, 'metrics');
      this.contradicted(upstream, 'metrics', problem, undefined);
      return;
    }
    const known = this.contradictions.get(upstream.name);
    if (known === undefined) return;
    // Reached otherwise now: the table honours it again already.
    if (!reachedAlike(known.config, upstream)) this.forget(upstream.name);
    else if (!known.evidence.delete('metrics') || known.evidence.size > 0) return;
    if (this.table.letVllmBalance(upstream.name, false)) {
      this.logger.info({ dpRouter: { upstream: upstream.name } }, `express-dp-router: upstream '${upstream.name}': its /metrics agree with its configuration again; claiming ranks there again.`);
    }
  }

  /** No probe starts after this; those out end unheeded. */
  close(): void {
    this.closed = true;
  }

  private probed(suspected: Suspected, endpoint: RouteEndpoint, value: string, numRanks: number, outcome: ProbeOutcome): void {
    suspected.probing = false;
    const name = suspected.config.name;
    const config = this.current(name);
    if (this.closed || this.suspected.get(name) !== suspected || config === undefined || !reachedAlike(suspected.config, config)) return;
    const sources = suspected.suspicion.sources;
    const evidence = { sent: value, rank: endpoint.rank, numRanks, sources, probe: outcome };
    // The router's own probe decides; only when it could not do the sources.
    if (outcome === 'refused' || (outcome === 'unknown' && this.verdicts.enough(sources))) {
      this.suspected.delete(name);
      this.verdicts.taken(name, 'rank_header', outcome === 'refused' ? 'probe' : 'sources', evidence);
      this.contradicted(config, 'answer', outOfRangeProblem(config, endpoint.rank, Number(value), numRanks), value);
      return;
    }
    this.verdicts.refused(name, 'rank_header', evidence);
    // The server took the very value the client's answer named: that answer was not the server's refusal.
    if (outcome === 'honoured') this.suspected.delete(name);
  }

  private contradicted(config: UpstreamConfig, evidence: RankHeaderEvidence, problem: string, refusedValue: string | undefined): void {
    let known = this.contradictions.get(config.name);
    if (known === undefined || !reachedAlike(known.config, config)) {
      this.forget(config.name);
      known = { config, evidence: new Set(), logged: new Set(), refusedValue: undefined, nextProbe: 0, probing: false };
      this.contradictions.set(config.name, known);
    }
    known.evidence.add(evidence);
    if (refusedValue !== undefined && known.refusedValue === undefined) {
      known.refusedValue = refusedValue;
      known.nextProbe = this.now() + this.liftEveryMs;
      this.held++;
    }
    this.table.letVllmBalance(config.name, true);
    if (known.logged.has(problem)) return;
    known.logged.add(problem);
    this.logger.error(
      { dpRouter: { upstream: config.name, evidence } },
      `express-dp-router: upstream '${config.name}' does not take the rank header the router sends it: ${problem}. Until then its requests go without one, as vLLM balances them.`,
    );
  }

  /** A probe found the refused value taken again: the verdict lifts (unless its `/metrics` still speak against it). */
  private lift(known: Contradiction): void {
    known.refusedValue = undefined;
    this.held--;
    known.evidence.delete('answer');
    known.logged.clear();
    if (known.evidence.size > 0) return;
    this.contradictions.delete(known.config.name);
    if (this.table.letVllmBalance(known.config.name, false)) {
      this.logger.info({ dpRouter: { upstream: known.config.name } }, `express-dp-router: upstream '${known.config.name}' takes the rank header again (the router's probe was answered); claiming ranks there again.`);
    }
  }

  private forget(name: string): void {
    if (this.contradictions.get(name)?.refusedValue !== undefined) this.held--;
    this.contradictions.delete(name);
  }

  private current(name: string): UpstreamConfig | undefined {
    return this.table.upstreams.find((upstream) => upstream.name === name);
  }
}
