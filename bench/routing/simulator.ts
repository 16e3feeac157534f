import type { PrefixAwarePolicy } from '../../lib/policies/prefix-aware';
import type { FirstTokenTotals, PeerLoad } from '../../lib/policies/prefix-aware-ttft';
import type { Endpoint, Policy } from '../../lib/types';
import { EventQueue } from './event-queue';
import { type RankModel, SimRank } from './rank';
import type { Rng } from './rng';
import { TOKENS_PER_BLOCK } from './tokens';
import type { SimRequest, Workload } from './workloads';

/**
 * An endpoint whose in-flight count the simulator moves; `load` is in-flight, as in the router,
 * plus what load feedback and peer announcements add.
 */
export class SimEndpoint implements Endpoint, FirstTokenTotals, PeerLoad {
  readonly key: string;
  readonly upstream = 'sim';
  readonly healthy = true;
  inflight = 0;
  /** What the router's time-to-first-token measurement feeds the policy ({@link FirstTokenTotals}). */
  firstTokens = 0;
  firstTokenSeconds = 0;
  /** Engine load from other gateways, as load feedback adds it (0 without). */
  externalLoad = 0;
  /** The other gateways' requests here, as `peers` announces them ({@link PeerLoad}; 0 without). */
  peerInflight = 0;
  /** Their uncached prefill blocks, of those without a first token yet (0 without `peers`). */
  peerBlocks = 0;

  constructor(readonly rank: number) {
    this.key = `sim#${rank}`;
  }

  get load(): number {
    return this.inflight + this.externalLoad + this.peerInflight;
  }
}

/** What baselines may see beyond a router's view: engine state and the request in flight. */
export interface SimView {
  rankOf(endpoint: Endpoint): SimRank;
  /** The request being routed. */
  current(): SimRequest;
  /** Simulated seconds since the run began. */
  now(): number;
}

/** Builds a fresh policy for one run. */
export type PolicyFactory = (setup: { view: SimView; rng: Rng; workload: Workload; placementSlack?: number }) => Policy;

/** What one (workload, policy, load level) run measured. */
export interface RunMetrics {
  /** Prompt tokens served from the rank's prefix cache ÷ all prompt tokens. */
  hitRate: number;
  /** The same routing with caches that never evict. */
  unboundedHitRate: number;
  /** Prompt + output tokens routed to each rank. */
  routedTokens: number[];
  maxOverMean: number;
  cov: number;
  /** Follow-up turns routed to the previous turn's rank, or null without conversations. */
  sameRankRate: number | null;
  ttftP50: number;
  ttftP99: number;
  completed: number;
}

/**
 * One gateway: its own policy instance and its own endpoint objects, whose in-flight counts
 * are the requests this gateway sent (a replica sees no other replica's traffic).
 */
export interface SimGateway {
  policy: Policy;
  readonly endpoints: readonly SimEndpoint[];
}

/** What a run may add to the plain replay (bench:replicas' scenarios). */
export interface SimExtras {
  /** Gateway restarts: at `at` seconds, gateway `gateway` gets a fresh policy from `remake`. */
  readonly restarts?: ReadonlyArray<{ readonly at: number; readonly gateway: number }>;
  readonly remake?: (gateway: number) => Policy;
  /**
   * Load feedback: every `intervalSeconds`, each gateway's endpoints learn the engine's
   * running + waiting beyond their own in-flight (and the peers' with `peers`), times `weight`
   * (the router's `loadFeedback`).
   */
  readonly feedback?: { readonly intervalSeconds: number; readonly weight: number };
  /**
   * Peer announcements (the router's `peers` option): each gateway's endpoints carry the other
   * gateways' requests to that rank, in flight (`peerInflight`, counted in `load`) and, for those
   * without a first token yet, their uncached prefill (`peerBlocks`: the routing policy's
   * `uncachedBlocks` right after the pick). A request's blocks are retired at its first token,
   * its in-flight at its finish. Instant: the other gateways know of a request the moment it is
   * routed (the router's datagrams take about a millisecond). A restarted gateway keeps its
   * endpoints' peer counts, as the real one gets them whole with its peers' next announcement
   * (they send absolute values), within one request or heartbeat.
   */
  readonly peers?: boolean;
  /**
   * Called as each gateway-routed request starts its prefill, with the gateway that routed it,
   * when it did (its arrival) and the prompt tokens its rank had cached: per-request figures
   * for measurements the run's totals cannot give (a restarted replica's warm-up).
   */
  readonly onPrefill?: (request: SimRequest, gateway: number, routedAt: number, cachedTokens: number) => void;
}

type SimEvent = { kind: 'arrive' | 'prefilled' | 'finish'; request: SimRequest } | { kind: 'restart'; gateway: number } | { kind: 'feedback' };

/**
 * Replays a workload through gateways on simulated vLLM ranks with a virtual clock. Requests
 * go to the gateways in turn, as a Kubernetes Service spreads connections over replicas.
 */
export function simulate(
  workload: Workload,
  secondsPerUnit: number,
  gateways: readonly SimGateway[],
  ranks: readonly SimRank[],
  model: RankModel,
  setCurrent: (request: SimRequest, now: number) => void,
  extras: SimExtras = {},
): RunMetrics {
  const requests = workload.requests;
  const followers = new Map<number, SimRequest[]>();
  const events = new EventQueue<SimEvent>();
  for (const request of requests) {
    if (request.follows === undefined) events.push(request.unitArrival * secondsPerUnit, { kind: 'arrive', request });
    else followers.set(request.follows, [...(followers.get(request.follows) ?? []), request]);
  }
  for (const { at, gateway } of extras.restarts ?? []) events.push(at, { kind: 'restart', gateway });
  const feedback = extras.feedback;
  let pending = requests.length;
  if (feedback !== undefined) events.push(feedback.intervalSeconds, { kind: 'feedback' });
  const arrivedAt = new Float64Array(requests.length);
  const rankOf = new Int32Array(requests.length).fill(-1);
  const gatewayOf = new Int32Array(requests.length);
  /** The blocks each request's gateway announced for it, retired at its first token. */
  const announcedBlocks = new Float64Array(requests.length);
  let arrivals = 0;
  const ttfts: number[] = [];
  const routedTokens = new Array<number>(ranks.length).fill(0);
  let hitTokens = 0;
  let unboundedHitTokens = 0;
  let promptTokens = 0;
  let followUps = 0;
  let sameRank = 0;

  /** What `peers` tells every gateway but `gateway` of a change in its requests to `rank`. */
  const announce = (gateway: number, rank: number, inflight: number, blocks: number): void => {
    for (let other = 0; other < gateways.length; other++) {
      if (other === gateway) continue;
      const endpoint = gateways[other].endpoints[rank];
      endpoint.peerInflight += inflight;
      endpoint.peerBlocks += blocks;
    }
  };

  const admit = (rank: SimRank, now: number): void => {
    const request = rank.admit(model);
    if (request === undefined) return;
    const cachedTokens = rank.cache.peek(request.inputBlocks) * TOKENS_PER_BLOCK;
    // The gateways' hit rate: requests that bypass them are not counted.
    if (gatewayOf[request.id] >= 0) {
      hitTokens += cachedTokens;
      unboundedHitTokens += rank.unbounded.peek(request.inputBlocks) * TOKENS_PER_BLOCK;
      promptTokens += request.inputTokens;
      extras.onPrefill?.(request, gatewayOf[request.id], arrivedAt[request.id], cachedTokens);
    }
    // vLLM recomputes at least the last token even on a full hit.
    const uncached = Math.max(1, request.inputTokens - cachedTokens);
    const prefillSeconds = model.prefillOverheadSeconds + uncached / model.prefillTokensPerSecond;
    events.push(now + prefillSeconds, { kind: 'prefilled', request });
  };

  while (events.size > 0) {
    const { time: now, item } = events.pop();
    if (item.kind === 'restart') {
      gateways[item.gateway].policy = extras.remake!(item.gateway);
      continue;
    }
    if (item.kind === 'feedback') {
      for (const { endpoints } of gateways) {
        for (const endpoint of endpoints) {
          const rank = ranks[endpoint.rank];
          // Beyond what this gateway and, with `peers`, the others announced: not counted twice.
          endpoint.externalLoad = Math.max(0, rank.running + rank.waitingCount - endpoint.inflight - endpoint.peerInflight) * feedback!.weight;
        }
      }
      if (pending > 0) events.push(now + feedback!.intervalSeconds, { kind: 'feedback' });
      continue;
    }
    const request = item.request;
    if (item.kind === 'arrive') {
      arrivedAt[request.id] = now;
      let rank: SimRank;
      if (request.direct !== undefined) {
        // Another client's request, straight to an engine: no gateway sees it.
        gatewayOf[request.id] = -1;
        rank = ranks[request.direct];
      } else {
        setCurrent(request, now);
        const gateway = arrivals++ % gateways.length;
        gatewayOf[request.id] = gateway;
        const { policy, endpoints } = gateways[gateway];
        const endpoint = policy.pick(endpoints, {
          path: request.path,
          affinityKey: policy.usesAffinityKey ? request.sessionKey : undefined,
          prompt: policy.usesPrompt ? request.prompt : undefined,
        }) as SimEndpoint;
        endpoint.inflight++;
        rank = ranks[endpoint.rank];
        if (extras.peers) {
          // A policy without the estimate (round-robin, the oracle) announces its requests alone.
          announcedBlocks[request.id] = (policy as Partial<PrefixAwarePolicy>).uncachedBlocks ?? 0;
          announce(gateway, rank.index, 1, announcedBlocks[request.id]);
        }
      }
      rankOf[request.id] = rank.index;
      routedTokens[rank.index] += request.inputTokens + request.outputTokens;
      if (request.previousTurn !== undefined) {
        followUps++;
        if (rankOf[request.previousTurn] === rank.index) sameRank++;
      }
      rank.enqueue(request);
      admit(rank, now);
    } else if (item.kind === 'prefilled') {
      const rank = ranks[rankOf[request.id]];
      const ttft = now - arrivedAt[request.id];
      if (gatewayOf[request.id] >= 0) {
        ttfts.push(ttft);
        const endpoint = gateways[gatewayOf[request.id]].endpoints[rank.index];
        endpoint.firstTokens++;
        endpoint.firstTokenSeconds += ttft;
        if (extras.peers) announce(gatewayOf[request.id], rank.index, 0, -announcedBlocks[request.id]);
      }
      rank.cache.store(request.inputBlocks);
      rank.unbounded.store(request.inputBlocks);
      rank.prefilling = false;
      events.push(now + request.outputTokens * model.decodeSecondsPerToken, { kind: 'finish', request });
      admit(rank, now);
    } else {
      const rank = ranks[rankOf[request.id]];
      rank.running--;
      rank.cache.store(request.sequenceBlocks);
      rank.unbounded.store(request.sequenceBlocks);
      if (gatewayOf[request.id] >= 0) {
        gateways[gatewayOf[request.id]].endpoints[rank.index].inflight--;
        if (extras.peers) announce(gatewayOf[request.id], rank.index, -1, 0);
      }
      pending--;
      for (const next of followers.get(request.id) ?? []) {
        events.push(now + next.unitThink * secondsPerUnit, { kind: 'arrive', request: next });
      }
      admit(rank, now);
    }
  }

  const mean = routedTokens.reduce((a, b) => a + b, 0) / routedTokens.length;
  const variance = routedTokens.reduce((sum, x) => sum + (x - mean) ** 2, 0) / routedTokens.length;
  ttfts.sort((a, b) => a - b);
  return {
    hitRate: hitTokens / promptTokens,
    unboundedHitRate: unboundedHitTokens / promptTokens,
    routedTokens,
    maxOverMean: Math.max(...routedTokens) / mean,
    cov: Math.sqrt(variance) / mean,
    sameRankRate: followUps === 0 ? null : sameRank / followUps,
    ttftP50: percentile(ttfts, 0.5),
    ttftP99: percentile(ttfts, 0.99),
    completed: ttfts.length,
  };
}

/** Nearest-rank percentile of sorted values. */
export function percentile(sorted: readonly number[], fraction: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(fraction * sorted.length) - 1))];
}
