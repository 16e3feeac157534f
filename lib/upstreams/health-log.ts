import type { Configuration } from '../options';
import type { HealthChange } from './health-checker';

/**
 * The log line of a health check verdict: one per upstream entry behind the probed URL (two
 * entries may share a server), naming its ranks.
 */
export function healthLog(config: Pick<Configuration, 'logger' | 'healthCheck'>): HealthChange {
  return (endpoints, up) => {
    const check = config.healthCheck;
    if (check === undefined) return;
    const why = up
      ? `passes its health check again (${check.healthyThreshold} × GET ${check.path})`
      : `failed ${check.unhealthyThreshold} health check${check.unhealthyThreshold === 1 ? '' : 's'} in a row (GET ${check.path})`;
    const ranks = new Map<string, number[]>();
    for (const endpoint of endpoints) {
      const list = ranks.get(endpoint.upstream);
      if (list) list.push(endpoint.rank);
      else ranks.set(endpoint.upstream, [endpoint.rank]);
    }
    for (const [upstream, list] of ranks) config.logger.healthChanged(upstream, list, up, why);
  };
}
