/**
 * The choice with objectives, pure: given each candidate's estimates (from the prefix-aware
 * policy) and the latency model, which candidate a request goes to.
 */
import type { LatencyModel, RankLatency } from './latency-model';

/**
 * The share of an objective a prediction may use and still count as meeting it. A request's
 * TPOT is predicted at the load it finds; the requests that arrive during its decode slow it too,
 * and a rank filled to the edge of the objective misses it with the next arrival. At 1 (no
 * headroom) `npm run bench:slo -- --quick` met 68 % of the TPOT objectives, the streams on the
 * busiest cache holders missing them.
 */
export const HEADROOM = 0.8;

/**
 * How much longer a request without objectives may be predicted to wait for its first token on
 * the rank it yields to, against the policy's own choice: it yields, it does not starve. Without
 * this bound the batch class piled onto the slow ranks (`bench:slo -- --quick`: its TTFT p99 2.5×
 * today's exact routing's).
 */
export const YIELD = 1.5;

/** Per candidate, filled by the policy for one pick (grown to the most candidates seen). */
export class SloEstimates {
  /** The prompt's blocks the candidate lacks (its own prefill). */
  uncached = new Float64Array(0);
  /** Prefill queued ahead of the request there, in the same blocks. */
  ahead = new Float64Array(0);
  /** Requests in flight there (its load). */
  load = new Float64Array(0);
  /** The policy's own cost (lower is better), the tie-break. */
  cost = new Float64Array(0);
  /** Each candidate's rank in the model. */
  ranks: RankLatency[] = [];
  /** Each candidate's tightest TPOT objective among its decoding streams, in seconds (Infinity: none). */
  tightest = new Float64Array(0);
  /** Out: predicted TTFT and TPOT per candidate, seconds (NaN when the model is cold). */
  ttft = new Float64Array(0);
  tpot = new Float64Array(0);

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
 * Predicts every candidate, then: with objectives, the candidate predicted to meet both with the
 * most of the prompt cached (the policy's cost breaks ties), else the least bad (the least
 * worst ratio of prediction to objective); without objectives, the policy's choice `bestAt`
 * unless one more decode there would break the TPOT objective of a stream running there, then
 * the policy's cheapest candidate where it would not (a long batch decode on a fast rank slows
 * every interactive stream there), among those predicted to give it its first token within
 * {@link YIELD} times the policy's choice.
 */
export function chooseWithObjectives(model: LatencyModel, est: SloEstimates, count: number, objectives: Objectives, bestAt: number, out: SloChoice): SloChoice {
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
    tpot[at] = tpotWarm ? model.tpot(rank, load[at] + 1) : 0;
  }
  out.predicted = true;
  const { ttft: ttftGoal, tpot: tpotGoal } = objectives;
  if (ttftGoal === 0 && tpotGoal === 0) {
    out.at = spare(est, count, bestAt);
    return out;
  }
  let best = -1;
  let leastBad = bestAt;
  let leastBadness = Infinity;
  for (let at = 0; at < count; at++) {
    const badness = Math.max(ttftGoal > 0 ? ttft[at] / ttftGoal : 0, tpotGoal > 0 ? tpot[at] / tpotGoal : 0);
    // Meeting its own objectives is not enough where it would break a running stream's.
    if (badness <= HEADROOM && !breaks(est, at)) {
      if (best < 0 || uncached[at] < uncached[best] || (uncached[at] === uncached[best] && less(est.cost[at], est.cost[best]))) best = at;
    } else if (badness < leastBadness) {
      leastBadness = badness;
      leastBad = at;
    }
  }
  if (best >= 0) {
    out.at = best;
    return out;
  }
  out.at = leastBad;
  out.meets = false;
  return out;
}

/** Without objectives: `bestAt`, unless one more decode there breaks a running stream's TPOT objective (see {@link chooseWithObjectives}). */
function spare(est: SloEstimates, count: number, bestAt: number): number {
  if (!breaks(est, bestAt)) return bestAt;
  let chosen = -1;
  const patience = YIELD * est.ttft[bestAt];
  for (let at = 0; at < count; at++) {
    if (breaks(est, at) || est.ttft[at] > patience) continue;
    if (chosen < 0 || less(est.cost[at], est.cost[chosen])) chosen = at;
  }
  return chosen < 0 ? bestAt : chosen;
}

/** Whether one more request at `at` would put its decoding streams' TPOT past the tightest of their objectives. */
function breaks(est: SloEstimates, at: number): boolean {
  const tightest = est.tightest[at];
  // `tpot` was predicted with the request's own decode counted: what every stream there would see.
  return tightest !== Infinity && est.tpot[at] > HEADROOM * tightest;
}

/** `a < b`, with NaN (a candidate the policy did not finish pricing) last. */
function less(a: number, b: number): boolean {
  return a < b || (Number.isNaN(b) && !Number.isNaN(a));
}
