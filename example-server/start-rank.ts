/**
 * Which engines a server runs, for an `--upstream URL@RANKS` whose list does not start at 0.
 * vLLM reads `X-data-parallel-rank` as an index from 0 into the engines its API server manages,
 * `range(start, start + local size)` (vLLM 52a31cc vllm/v1/engine/core_client.py:596-606,
 * checked in vllm/v1/engine/input_processor.py:252-259), and labels each engine's metrics with
 * its global rank, `engine="<rank>"` (vllm/v1/metrics/loggers.py:429-434). `URL@1,3,5,7` may be
 * half of an internal-LB server (engines 0–7: headers 1,3,5,7) and `URL@4-7` a hybrid node
 * started with `--data-parallel-start-rank 4` (engines 4–7: headers 0–3); only the server can
 * tell which, so it is asked once, before the router starts.
 */
import type { UpstreamOptions } from '../lib';
import { fetchText } from '../lib/upstreams/scrape';
import { redactUrl } from '../lib/upstreams/upstream-url';
import { parseEngineReport } from '../lib/upstreams/vllm-metrics';
import { START_RANK_UNKNOWN, type GatewayUpstream } from './cli';

/** How long a server's `/metrics` may take to answer at start. */
export const START_RANK_TIMEOUT_MS = 5000;

/** A server whose first engine neither its `/metrics` nor the command line says; the message is one line. */
export class StartRankProblem extends Error {}

/**
 * The upstreams with the start rank of each `learnStartRank` one set to the first engine its
 * `/metrics` name, every one of its ranks checked to be among them. Throws a
 * {@link StartRankProblem} when a page cannot be read or names no engine, or names engines
 * that leave out a configured rank.
 */
export async function learnStartRanks<T extends GatewayUpstream>(upstreams: readonly T[], timeoutMs = START_RANK_TIMEOUT_MS): Promise<T[]> {
  return Promise.all(
    upstreams.map(async (upstream) => {
      const { learnStartRank: flag, ...rest } = upstream;
      if (flag === undefined || !('url' in rest)) return upstream;
      const { url, ranks = [] } = rest as UpstreamOptions;
      const shown = `${flag} ${redactUrl(url)}@${ranks.join(',')}`;
      let engines: readonly number[];
      try {
        engines = parseEngineReport(await fetchText(`${url.replace(/\/+$/, '')}/metrics`, timeoutMs)).engines;
      } catch (error) {
        throw new StartRankProblem(`${shown}: ${START_RANK_UNKNOWN}; its /metrics would say (${redactUrl((error as Error).message)})`);
      }
      if (engines.length === 0) throw new StartRankProblem(`${shown}: ${START_RANK_UNKNOWN}; its /metrics name no engine="N"`);
      const missing = ranks.filter((rank) => !engines.includes(rank));
      if (missing.length > 0) {
        throw new StartRankProblem(`${shown}: its /metrics name engines ${engines.join(',')}, not rank${missing.length === 1 ? '' : 's'} ${missing.join(',')}: give the ranks that server runs`);
      }
      const first = engines[0];
      return { ...rest, startRank: first, dataParallelSize: ranks[ranks.length - 1] - first + 1 } as T;
    }),
  );
}
