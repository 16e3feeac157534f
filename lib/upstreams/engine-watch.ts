import type { EndpointTable } from './endpoints';
import type { RouterMetrics } from '../observe/metrics';
import { DISCOVER_TIMEOUT_MS, type LoadFeedbackConfig } from './engine-watch-options';
import { fetchText } from './scrape';
import type { UpstreamConfig } from './upstream-options';
import { parseEngineReport, type EngineReport } from './vllm-metrics';

/** Reads each watched upstream's `/metrics`; `sync()` follows a reconfiguration. */
export interface EngineWatch {
  /** Starts polling new upstreams that need it and stops polling removed ones. */
  sync(): void;
  stop(): void;
}

/** What a read of an upstream's `/metrics` tells. */
export interface EngineReports {
  /**
   * With `discover`: its `engine` labels name other engines than it is configured with (`engines`,
   * global ranks, ascending); `ranks`: those of them to route to (all, or those its `ranks` option lists).
   */
  discovered(upstream: UpstreamConfig, engines: readonly number[], ranks: readonly number[]): void;
  /** The engines its labels name (global ranks, ascending, at least one), after any discovery, against the configuration now. */
  engines(upstream: UpstreamConfig, engines: readonly number[]): void;
}

interface Target {
  name: string;
  url: string;
  intervalMs: number;
  timer: NodeJS.Timeout | undefined;
  abort: AbortController;
}

/** What a watched upstream is polled for: both needs share one poll. */
function needs(upstream: UpstreamConfig, feedback: LoadFeedbackConfig | undefined): number | undefined {
  const intervals = [upstream.discoverIntervalMs, feedback?.intervalMs].filter((ms): ms is number => ms !== undefined);
  return intervals.length === 0 ? undefined : Math.min(...intervals);
}

/** The upstreams that `watchEngines` polls (for the scrape-failure metric's series). */
export function watchedUpstreams(upstreams: readonly UpstreamConfig[], feedback: LoadFeedbackConfig | undefined): string[] {
  return upstreams.filter((upstream) => needs(upstream, feedback) !== undefined).map((upstream) => upstream.name);
}

/**
 * Polls each upstream that discovers its ranks or feeds back engine load, once at start and
 * then every interval (the next poll is scheduled when one ends, so a slow server is never
 * polled twice at once). Timers are unref'd. A failed poll counts in
 * `upstream_scrape_failures_total` and drops that upstream's engine load back to local counts.
 */
export function watchEngines(
  table: EndpointTable,
  feedback: LoadFeedbackConfig | undefined,
  metrics: RouterMetrics,
  reports: EngineReports,
): EngineWatch {
  const targets = new Map<string, Target>();
  const timeoutMs = feedback?.timeoutMs ?? DISCOVER_TIMEOUT_MS;
  let stopped = false;

  const current = (name: string) => table.upstreams.find((upstream) => upstream.name === name);

  const poll = (target: Target) => {
    target.timer = undefined;
    fetchText(`${target.url}/metrics`, timeoutMs, target.abort.signal).then(
      (text) => apply(target, parseEngineReport(text)),
      () => fail(target),
    ).finally(() => {
      if (stopped || targets.get(target.name) !== target) return;
      target.timer = setTimeout(() => poll(target), target.intervalMs).unref();
    });
  };

  const apply = (target: Target, report: EngineReport) => {
    const upstream = current(target.name);
    if (stopped || upstream === undefined) return;
    if (feedback) {
      for (const endpoint of table.all) {
        if (endpoint.config.name !== target.name) continue;
        const engine = report.load.get(endpoint.rank);
        // The engine's count includes this router's own requests and those its peers announce;
        // the rest is other gateways' (or direct clients'), which only the engine can tell.
        const others = engine === undefined ? 0 : Math.max(0, engine.running + engine.waiting - endpoint.inflight - endpoint.peerInflight);
        endpoint.externalLoad = others * feedback.weight;
        endpoint.engineWaiting = engine?.waiting ?? 0;
      }
    }
    if (report.engines.length === 0) return;
    if (upstream.discoverIntervalMs !== undefined) {
      // Discovery narrows the ranks a `ranks` option lists to those served, never past them; none
      // of them served is a contradiction the rank-header guard reports (`engines`), not a change.
      const ranks = upstream.rankList === undefined ? report.engines : report.engines.filter((rank) => upstream.rankList!.includes(rank));
      if (ranks.length > 0 && (!sameRanks(upstream.ranks, ranks) || upstream.startRank !== report.engines[0])) reports.discovered(upstream, report.engines, ranks);
    }
    const now = current(target.name);
    if (now !== undefined) reports.engines(now, report.engines);
  };

  const fail = (target: Target) => {
    if (stopped) return;
    metrics.scrapeFailed(target.name);
    for (const endpoint of table.all) if (endpoint.config.name === target.name) {
      endpoint.externalLoad = 0;
      endpoint.engineWaiting = 0;
    }
  };

  const sync = () => {
    if (stopped) return;
    const wanted = new Map<string, { url: string; intervalMs: number }>();
    for (const upstream of table.upstreams) {
      const intervalMs = needs(upstream, feedback);
      if (intervalMs !== undefined) wanted.set(upstream.name, { url: upstream.url, intervalMs });
    }
    for (const [name, target] of targets) {
      const want = wanted.get(name);
      if (want && want.url === target.url && want.intervalMs === target.intervalMs) continue;
      end(target);
      targets.delete(name);
    }
    for (const [name, want] of wanted) {
      if (targets.has(name)) continue;
      const target: Target = { name, ...want, timer: undefined, abort: new AbortController() };
      targets.set(name, target);
      poll(target);
    }
  };

  const end = (target: Target) => {
    clearTimeout(target.timer);
    target.abort.abort();
  };

  sync();
  return {
    sync,
    stop: () => {
      stopped = true;
      for (const target of targets.values()) end(target);
      targets.clear();
    },
  };
}

function sameRanks(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((rank, index) => rank === b[index]);
}
