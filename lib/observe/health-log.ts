import type { RouterLogger } from './logger';
import type { Endpoint } from '../types';

/** What a health check verdict's log line names of the check (`healthCheck`'s resolved settings). */
export interface HealthRule {
  readonly path: string;
  readonly healthyThreshold: number;
  readonly unhealthyThreshold: number;
}

/**
 * The log lines of a health check verdict: one per upstream entry behind the probed URL (two
 * entries may share a server), naming its ranks and the rule that was met.
 */
export function logHealthChange(logger: RouterLogger, check: HealthRule, endpoints: readonly Endpoint[], up: boolean): void {
  const why = up
    ? `passes its health check again (${check.healthyThreshold} × GET ${check.path})`
    : `failed ${check.unhealthyThreshold} health check${check.unhealthyThreshold === 1 ? '' : 's'} in a row (GET ${check.path})`;
  const ranks = new Map<string, number[]>();
  for (const endpoint of endpoints) {
    // The upstream's balanced endpoint (no rank) follows its server; the ranks name it.
    if (endpoint.rank < 0) continue;
    const list = ranks.get(endpoint.upstream);
    if (list) list.push(endpoint.rank);
    else ranks.set(endpoint.upstream, [endpoint.rank]);
  }
  for (const [upstream, list] of ranks) logger.healthChanged(upstream, list, up, why);
}
