/**
 * SLO routing of a disaggregated request's prefill leg (docs/disaggregation.md): the prefill rank
 * is chosen for the decode rank the request already holds, so that the pair's predicted TTFT,
 *
 *   TTFT = prefill(p) + decode(d)
 *
 * meets the request's objective, TPOT being the decode rank's. `prefill(p)` is the prefill pool's
 * own latency model (its ranks' shape and speeds, learned from each prefill leg's measured
 * duration), read as the decode side's is: the rank's queued prefill and the prompt's uncached
 * blocks there, from the prefill policy's (prefix-aware) estimates, and its load. `decode(d)` is
 * the decode rank's TTFT prediction, which for a disaggregated request the router learns from
 * what follows the prefill leg's answer (the KV transfer, the queue there, a first step): the
 * transfer is learned with the decode rank's part, not apart.
 */
import type { Endpoint } from '../types';
import { HEADROOM, SloEstimates, type Objectives, type SloChoice } from './choose';
import type { LatencyModel, RankLatency } from './latency-model';
import type { PickSteer } from '../policies/pick-steer';

/**
 * The decode rank's part, in seconds, while its model is cold (fewer than 16 streams learned): a
 * small constant for the transfer and a first step. It is the same for every prefill candidate:
 * it moves the prediction, not the choice between prefill ranks.
 */
export const COLD_DECODE_SECONDS = 0.005;

/** What the pair's choice reads of the request: its objectives and what its decode rank was predicted. */
export interface PairContext extends Objectives {
  /** The decode rank's predicted part of the TTFT, seconds (NaN when its model is cold). */
  readonly decodeWait: number;
  /** The decode rank's predicted TPOT, seconds (NaN when cold). */
  readonly predictedTpot: number;
}

/**
 * The prefill candidate for a decode rank already chosen: among those whose pair is predicted to
 * meet both objectives (within {@link HEADROOM}), the one holding most of the prompt (ties by the
 * prefill policy's own cost); none: the least bad. Each candidate costs a few multiply-adds.
 */
export function choosePrefill(model: LatencyModel, est: SloEstimates, count: number, pair: PairContext, bestAt: number, out: SloChoice): SloChoice {
  out.at = bestAt;
  out.meets = true;
  out.predicted = false;
  if (!model.ttftWarm) return out;
  model.prepare();
  const { uncached, ahead, load, ttft, ranks, cost } = est;
  const extra = Number.isNaN(pair.decodeWait) ? COLD_DECODE_SECONDS : pair.decodeWait;
  // TPOT is the decode rank's: the same for every prefill candidate.
  const tpotBadness = pair.tpot > 0 && pair.predictedTpot >= 0 ? pair.predictedTpot / pair.tpot : 0;
  let best = -1;
  let leastBad = bestAt;
  let leastBadness = Infinity;
  for (let at = 0; at < count; at++) {
    ttft[at] = model.ttft(ranks[at], ahead[at] + uncached[at], load[at]) + extra;
    const badness = Math.max(pair.ttft > 0 ? ttft[at] / pair.ttft : 0, tpotBadness);
    if (badness <= HEADROOM) {
      if (best < 0 || uncached[at] < uncached[best] || (uncached[at] === uncached[best] && cost[at] < cost[best])) best = at;
    } else if (badness < leastBadness) {
      leastBadness = badness;
      leastBad = at;
    }
  }
  out.predicted = true;
  out.at = best >= 0 ? best : leastBad;
  out.meets = best >= 0;
  return out;
}

/** What the prefill steer records on the request: where its prefill was predicted for, with what. */
export interface PrefillPrediction {
  rank: RankLatency | undefined;
  endpoint: Endpoint | undefined;
  work: number;
  load: number;
}

/**
 * The prefill pick's steer (`ctx.slo` of the prefill policy's pick), made per request by the
 * ticket: the policy fills the estimates, {@link choosePrefill} picks.
 */
export class PrefillSteer implements PickSteer {
  constructor(
    private readonly model: LatencyModel,
    readonly estimates: SloEstimates,
    private readonly choice: SloChoice,
    private readonly pair: PairContext,
    private readonly chosen: (choice: SloChoice, prediction: PrefillPrediction, ttft: number) => number,
  ) {}

  steer(candidates: readonly Endpoint[], count: number, bestAt: number): number {
    const { model, estimates: est } = this;
    for (let at = 0; at < count; at++) est.ranks[at] = model.rank(candidates[at].key);
    const choice = choosePrefill(model, est, count, this.pair, bestAt, this.choice);
    const at = choice.at;
    return this.chosen(choice, { rank: est.ranks[at], endpoint: candidates[at], work: est.ahead[at] + est.uncached[at], load: est.load[at] }, est.ttft[at]);
  }
}
