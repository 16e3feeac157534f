/**
 * The choice with objectives, pure: given each candidate's estimates (from the prefix-aware
 * policy) and the latency model, which candidate a request goes to.
 */
import { PREFILL_SECONDS, type LatencyModel, type RankLatency } from './latency-model';

/**
 * The share of an objective a prediction may use and still count as meeting it. A request's
 * TPOT is predicted at the load it finds; the requests that arrive during its decode slow it too,
 * and a rank filled to the edge of the objective misses it with the next arrival. At 1 (no
 * headroom) `npm run bench:slo -- --quick` met 68 % of the TPOT objectives, the streams on the
 * busiest cache holders missing them.
 */
export const HEADROOM = 0.8;

/**
 * How much longer than the rank's own time with nothing ahead a request without objectives may be
 * predicted to wait for its first token on a rank it goes to for the others' sake: it yields, it
 * does not starve. The bound is the rank's own capacity, not a fast rank's time: bounded against
 * the policy's choice (slo-lib before slo-tune), a half-speed rank never qualified, the batch class
 * piled onto the fast ranks that held no interactive stream at the moment, and those became
 * batch-only ranks the interactive class avoided (docs/performance.md, "SLO routing").
 */
export const YIELD = 1.5;

/** The running mean of the TPOT objectives seen follows about the last 64. */
const OBJECTIVE_SMOOTHING = 1 / 64;

/** Per candidate, filled by the policy for one pick (grown to the most candidates seen). */
export class SloEstimates {
  /** The prompt's blocks the candidate lacks (its own prefill). */
  uncached = new Float64Array(0);
  /** Prefill queued ahead of the request there, in the same blocks. */
  ahead = new Float64Array(0);
  /** Requests in flight there (its load). */
  load = new Float64Array(0);
  /** When the estimates were made, seconds (`performance.now()`'s clock): the ranks' prefill rates are read as of then. */
  now = 0;
  /** The policy's own cost (lower is better), the tie-break. */
  cost = new Float64Array(0);
  /** Each candidate's rank in the model. */
  ranks: RankLatency[] = [];
  /** Each candidate's tightest TPOT objective among its decoding streams, in seconds (Infinity: none). */
  tightest = new Float64Array(0);
  /** Out: predicted TTFT and TPOT per candidate, seconds (NaN when the model is cold). */
  ttft = new Float64Array(0);
  tpot = new Float64Array(0);
  /**
   * The running mean of the TPOT objectives of the requests steered (seconds; 0 before the
   * first): a rank predicted to miss it with nothing else running serves no objective, and a
   * request without objectives costs nobody's there.
   */
  objectiveTpot = 0;

  ensure(count: number): void {
    if (this.uncached.length >= count) return;
    this.uncached = new Float64Array(count);
    this.ahead = new Float64Array(count);
    this.load = new Float64Array(count);
    this.cost = new Float64Array(count);
    this.tightest = new Float64Array(count);
    this.ttft = new Float64Array(count);
    this.tpot = new Float64Array(count);
    this.ranks = new Array<RankLatency>(count);
  }
}

/** A request's objectives in seconds; 0 for none. */
export interface Objectives {
  readonly ttft: number;
  readonly tpot: number;
}

/** What the choice found: where to go, and whether it meets the objectives there (`shed`: none does, and shedding is on). */
export interface SloChoice {
  at: number;
  /** The objectives are predicted met at `at` (true when the request has none or the model is cold). */
  meets: boolean;
  /** Whether predictions were made. */
  predicted: boolean;
}

/**
 * Predicts every candidate, then: with objectives, the candidates in four tiers, the first one
 * not empty deciding: predicted to meet both objectives within {@link HEADROOM} and to leave
 * every stream decoding there within it too; to meet them (and leave those streams within their
 * own) without headroom; to miss them; to miss TPOT even alone (a slower GPU). In the first two,
 * the one that uses least of the objectives, the sum of its predictions' shares (its TTFT share
 * prices the cache hit against the queue and the load, its TPOT share the decodes running there;
 * without a TTFT objective, the fewest uncached blocks); in the last two, the least bad (the least
 * worst ratio of prediction to objective). The fewest uncached blocks, then the policy's cost,
 * break ties. Only the first tier `meets` (a shed otherwise).
 *
 * Taking the best hit outright filled the cache holders to the edge of the TPOT objective while
 * ranks beside them ran half empty. With the second tier read as the third (slo-tune), most
 * decisions of `bench:slo` (379 of 439 in one run) were "least bad" by the worst share alone,
 * TPOT's: the TTFT share, and with it the queue, no longer counted, and while the fitted cost of
 * a request in flight was still small (the first ten seconds) requests herded onto one rank
 * whose predicted TPOT barely grew with its load. A rank too slow for the TPOT objective came
 * before a fast one predicted to miss TTFT: a miss for certain against a prediction that may err.
 * Without objectives see {@link spare}.
 */
export function chooseWithObjectives(model: LatencyModel, est: SloEstimates, count: number, objectives: Objectives, bestAt: number, out: SloChoice): SloChoice {
  const { ttft: ttftGoal, tpot: tpotGoal } = objectives;
  if (tpotGoal > 0) est.objectiveTpot = est.objectiveTpot === 0 ? tpotGoal : est.objectiveTpot + (tpotGoal - est.objectiveTpot) * OBJECTIVE_SMOOTHING;
  out.at = bestAt;
  out.meets = true;
  out.predicted = false;
  if (!model.ttftWarm) return out;
  model.prepare();
  const tpotWarm = model.tpotWarm;
  const { uncached, ahead, load, ttft, tpot, ranks } = est;
  for (let at = 0; at < count; at++) {
    const rank = ranks[at];
    ttft[at] = model.ttft(rank, ahead[at] + uncached[at], load[at]);
    // Its own prefill counted with the rank's: the streams decoding there share steps with it.
    tpot[at] = tpotWarm ? model.tpot(rank, load[at] + 1, rank.prefillRate(est.now) + uncached[at] / PREFILL_SECONDS) : 0;
  }
  out.predicted = true;
  if (ttftGoal === 0 && tpotGoal === 0) {
    out.at = spare(model, est, count, bestAt);
    return out;
  }
  let best = bestAt;
  let bestTier = 4;
  let bestKey = Infinity;
  for (let at = 0; at < count; at++) {
    const ttftShare = ttftGoal > 0 ? ttft[at] / ttftGoal : 0;
    const tpotShare = tpotGoal > 0 ? tpot[at] / tpotGoal : 0;
    const badness = Math.max(ttftShare, tpotShare);
    // Meeting its own objectives is not enough where it would break a running stream's.
    const tier =
      badness <= HEADROOM && !breaks(est, at, HEADROOM) ? 0
      : badness <= 1 && !breaks(est, at, 1) ? 1
      : tpotWarm && tpotGoal > 0 && model.tpot(ranks[at], 1) > tpotGoal ? 3
      : 2;
    // Met (within headroom or not): the TTFT share prices the cache hit (the prefill it saves) against the load; without a TTFT objective, the hit itself. Missed: the least bad.
    const key = tier < 2 ? (ttftGoal > 0 ? ttftShare + tpotShare : uncached[at]) : badness;
    if (tier < bestTier || (tier === bestTier && (key < bestKey || (key === bestKey && (uncached[at] < uncached[best] || (uncached[at] === uncached[best] && less(est.cost[at], est.cost[best]))))))) {
      best = at;
      bestTier = tier;
      bestKey = key;
    }
  }
  out.at = best;
  out.meets = bestTier === 0;
  return out;
}

/**
 * Without objectives, where the request costs the objectives of others least, among the
 * candidates where one more decode breaks no running stream's TPOT objective and its own first
 * token is predicted within {@link YIELD} times the rank's own time for it with nothing ahead
 * (its capacity, not a faster rank's time). First a rank that serves no objective: predicted,
 * with nothing else running, to miss the TPOT objectives seen (a slower GPU), holding no more
 * than its share of the requests in flight; the policy's cheapest of those. Then a rank where no
 * stream with a TPOT objective is decoding: its prefill and decode slow nobody's objective now;
 * once an objective has been seen, one that already runs requests before one that runs none. An
 * idle fast rank given such a request is one the next requests with objectives avoid (its
 * predicted TPOT counts the prefill sent there), and while it holds the class it gets more of
 * it: in `bench:slo` an overflow from the ranks serving the class took a third fast rank from the
 * interactive class (docs/performance.md, "A third batch rank": the order lowered the class's
 * TTFT p99 and did not stop that in every run). Then the others. Among those, the policy's
 * choice `bestAt` if it is among them; else the least loaded, so that the class spreads over the
 * ranks instead of filling a few that the requests with objectives then avoid (the policy's
 * cost breaks ties). None: the least predicted
 * TTFT where it breaks no stream's objective, if within {@link YIELD} times the least anywhere,
 * else that least (it yields, it does not starve). (Taking, among the ranks where no stream with
 * an objective decodes, the one where none had for longest first, 8e63731, concentrated the
 * batch class on one fast rank: its TTFT p99 rose, the attainment did not, over three runs.)
 */
function spare(model: LatencyModel, est: SloEstimates, count: number, bestAt: number): number {
  const { uncached, load, ttft, ranks, cost, tightest } = est;
  const busy = model.tpotWarm && est.objectiveTpot > 0 ? HEADROOM * est.objectiveTpot : Infinity;
  let total = 0;
  for (let at = 0; at < count; at++) total += load[at];
  const share = total / count;
  let chosen = -1;
  let chosenTier = 4;
  let soonest = 0;
  let soonestSpared = -1;
  for (let at = 0; at < count; at++) {
    if (ttft[at] < ttft[soonest]) soonest = at;
    if (breaks(est, at)) continue;
    if (soonestSpared < 0 || ttft[at] < ttft[soonestSpared]) soonestSpared = at;
    const rank = ranks[at];
    if (ttft[at] > YIELD * model.ttft(rank, uncached[at], 0)) continue;
    // A slow rank past its share is one of the others: filled further, its queue holds batch first tokens for seconds.
    const slow = model.tpot(rank, 1) > busy;
    // Tiers: 0 a slow rank within its share, 1 a fast rank running requests but none with an objective, 2 an idle fast rank, 3 the others.
    // Before any objective is seen there is no class to keep ranks for: an idle rank does not come later.
    const tier = slow ? (load[at] <= share ? 0 : 3) : tightest[at] === Infinity ? (load[at] > 0 || est.objectiveTpot === 0 ? 1 : 2) : 3;
    if (tier > chosenTier) continue;
    if (chosen < 0 || tier < chosenTier || (tier === 0 ? less(cost[at], cost[chosen]) : at === bestAt || (chosen !== bestAt && (load[at] < load[chosen] || (load[at] === load[chosen] && less(cost[at], cost[chosen])))))) {
      chosen = at;
      chosenTier = tier;
    }
  }
  if (chosen >= 0) return chosen;
  return soonestSpared >= 0 && ttft[soonestSpared] <= YIELD * ttft[soonest] ? soonestSpared : soonest;
}

/** Whether one more request at `at` would put its decoding streams' TPOT past the tightest of their objectives. */
function breaks(est: SloEstimates, at: number, headroom = HEADROOM): boolean {
  const tightest = est.tightest[at];
  // `tpot` was predicted with the request's own decode counted: what every stream there would see.
  return tightest !== Infinity && est.tpot[at] > headroom * tightest;
}

/** `a < b`, with NaN (a candidate the policy did not finish pricing) last. */
function less(a: number, b: number): boolean {
  return a < b || (Number.isNaN(b) && !Number.isNaN(a));
}
