/**
 * The latency model: per rank, the time to first token (TTFT) and the time per output token
 * (TPOT) a request would see there, learned online from what the router measures itself.
 *
 *   TTFT(r) = k_r × (a·W + b·D + c)      TPOT(r) = m_r × (t0 + t1·D' + t2·P)
 *
 * `W` is the prefill ahead of the request on the rank plus its own uncached part, in the
 * prefix-aware policy's blocks (docs/slo-routing.md); `D` the requests in flight there (its load:
 * every running request slows each engine step), `D'` the same during the request's decode (its
 * own included); `P` the uncached blocks the router sent to the rank per token the stream
 * decoded (vLLM's chunked prefill computes them in the same steps as the decodes, each slowing
 * every stream there: 52a31cc vllm/v1/core/sched/scheduler.py:364-498 schedules the running
 * requests' tokens, then from 548 the waiting requests' prefill from the same step's budget). The shape (a, b, c, t0, t1, t2) is fitted over every rank by decayed least squares;
 * `k_r` and `m_r` are each rank's speed against that shape (a slower GPU, a noisy neighbour).
 * A prediction is a few multiply-adds; learning (a few dozen operations, at a first token and at
 * a stream's end) and the fits (solved when next read after a sample) stay off the decision.
 *
 * Without `P`, the first seconds' streams, slowed by every family prompt's first prefill at a
 * low load, taught a TPOT flat in the load (0.1–0.4 ms per request in flight against the mock's
 * 2 ms, for ten seconds and more): interactive streams herded onto the ranks holding their
 * prefixes (docs/performance.md, "Prefill in the TPOT model"). With it, the fit read the mock's
 * own costs within seconds (2.0 ms per request, 4.7 ms per block and token).
 *
 * Every observation is bounded: its weight by its source's share ({@link SourceShares}), its
 * value to [¼, 4×] the current prediction once the model is warm. A rank's speed is the median
 * of its sources' own estimates once three sources or more have measured it, so that one source
 * cannot move it at all, nor, its samples of that rank being left out of the fit, the shape;
 * with fewer, their pooled ratio.
 */
import { DecayedFit } from '../policies/decayed-fit';
import { SourceShares } from './source-shares';

/**
 * The time over which a rank's rate of prefill sent is averaged, seconds: about an interactive
 * answer's decode, the span whose steps the prefill sent now will share.
 */
export const PREFILL_SECONDS = 2;
/** The most of a stream's time a prediction gives to the prefill it shares steps with (the fixed point in `tpot` diverges at all of it). */
const MAX_PREFILL_SHARE = 0.8;
/** Samples before the fleet's shape replaces "no prediction". */
export const WARM_SAMPLES = 16;
/** Fleet fits follow about the last 512 samples. */
const FLEET_DECAY = 1 - 1 / 512;
/** A rank's speed follows about its last 64 samples from each source. */
const RANK_DECAY = 1 - 1 / 64;
/** A warm prediction's error bars for one observation: what a sample may say, against it. */
const CLIP = 4;
/** A rank's speed factor stays within [1/8, 8] of the fleet's shape. */
const MAX_SPEED = 8;
/** Sources tracked per rank (the ones with most weight stay). */
const SOURCES_PER_RANK = 16;
/** From this many sources a rank's speed is their median. */
const MEDIAN_SOURCES = 3;
/** A source whose own view of a rank is off the rank's median by more than this factor teaches the fleet's shape nothing. */
const OUTLIER = 1.5;

/** Decayed ratio of measured to shape-predicted times, one source's view of one rank. */
class Ratio {
  num = 0;
  den = 0;
  add(measured: number, shaped: number, weight: number, decay: number): void {
    this.num = this.num * decay + weight * measured;
    this.den = this.den * decay + weight * shaped;
  }
}

/** One rank's speed against the fleet's shape, for one kind (TTFT or TPOT). */
class RankSpeed {
  /** The factor predictions read. */
  factor = 1;
  samples = 0;
  private readonly bySource = new Map<string, Ratio>();
  private readonly pooled = new Ratio();

  learn(source: string, measured: number, shaped: number, weight: number): void {
    if (!(shaped > 0)) return;
    this.samples++;
    this.pooled.add(measured, shaped, weight, RANK_DECAY);
    let own = this.bySource.get(source);
    if (own === undefined) {
      if (this.bySource.size >= SOURCES_PER_RANK) this.dropLightest();
      this.bySource.set(source, (own = new Ratio()));
    }
    own.add(measured, shaped, 1, RANK_DECAY);
    this.factor = bound(this.estimate());
  }

  /**
   * Whether `source`'s samples of this rank may shape the fleet's fit: not when, with enough
   * sources to tell, its own ratio is an outlier. Its samples normalized by the rank's honest
   * speed would otherwise inflate the shape for every rank (the median keeps only the rank's own).
   */
  agrees(source: string): boolean {
    if (this.bySource.size < MEDIAN_SOURCES) return true;
    const own = this.bySource.get(source);
    if (own === undefined || !(own.den > 0)) return true;
    const ratio = own.num / own.den / this.factor;
    return ratio < OUTLIER && ratio > 1 / OUTLIER;
  }

  private estimate(): number {
    const ratios: number[] = [];
    for (const ratio of this.bySource.values()) if (ratio.den > 0) ratios.push(ratio.num / ratio.den);
    if (ratios.length < MEDIAN_SOURCES) return this.pooled.den > 0 ? this.pooled.num / this.pooled.den : 1;
    ratios.sort((x, y) => x - y);
    const mid = ratios.length >> 1;
    return ratios.length % 2 === 1 ? ratios[mid] : (ratios[mid - 1] + ratios[mid]) / 2;
  }

  private dropLightest(): void {
    let lightest: string | undefined;
    let least = Infinity;
    for (const [source, ratio] of this.bySource) {
      if (ratio.den < least) {
        least = ratio.den;
        lightest = source;
      }
    }
    if (lightest !== undefined) this.bySource.delete(lightest);
  }
}

function bound(factor: number): number {
  return Number.isFinite(factor) && factor > 0 ? Math.min(MAX_SPEED, Math.max(1 / MAX_SPEED, factor)) : 1;
}

/** One rank's learned speeds (kept by the model, read per candidate). */
export class RankLatency {
  readonly ttft = new RankSpeed();
  readonly tpot = new RankSpeed();
  /** The least TPOT objective (seconds) of the streams decoding here; Infinity when none has one. */
  tightestTpot = Infinity;
  /** Those objectives, one entry per stream. */
  private readonly goals: number[] = [];
  /** Uncached blocks sent here, ever: a stream's `P` is their growth over its decode. */
  prefilled = 0;
  /** Blocks per second sent here, decayed over {@link PREFILL_SECONDS}, as of `rateAt` (seconds). */
  private rate = 0;
  private rateAt = 0;

  /** A request with `blocks` uncached blocks was sent here at `now` (seconds, `performance.now()`'s clock). */
  sent(blocks: number, now: number): void {
    if (!(blocks > 0) || !Number.isFinite(blocks)) return;
    this.prefilled += blocks;
    this.rate = this.prefillRate(now) + blocks / PREFILL_SECONDS;
    this.rateAt = now;
  }

  /**
   * Takes back `blocks` counted by {@link sent} at `sentAt`: the request's prompt was not computed
   * here after all (computed elsewhere, or the engine refused the request). What is left of its
   * part of the rate, decayed since, is removed, not the part of other requests.
   */
  withdraw(blocks: number, sentAt: number, now: number): void {
    if (!(blocks > 0) || !Number.isFinite(blocks)) return;
    this.prefilled = Math.max(0, this.prefilled - blocks);
    const age = Math.max(0, now - sentAt);
    this.rate = Math.max(0, this.prefillRate(now) - (blocks / PREFILL_SECONDS) * Math.exp(-age / PREFILL_SECONDS));
    this.rateAt = now;
  }

  /** Uncached blocks per second sent here lately, at `now` (seconds). */
  prefillRate(now: number): number {
    const age = now - this.rateAt;
    return age > 0 ? this.rate * Math.exp(-age / PREFILL_SECONDS) : this.rate;
  }

  /** A stream with TPOT objective `goal` began (`+1`) or stopped (`-1`) decoding here. */
  decoding(goal: number, change: 1 | -1): void {
    const { goals } = this;
    if (change > 0) goals.push(goal);
    else {
      const at = goals.indexOf(goal);
      if (at >= 0) goals.splice(at, 1);
    }
    let least = Infinity;
    for (const one of goals) if (one < least) least = one;
    this.tightestTpot = least;
  }
}

/** The fleet's shape and each rank's speed; see the module comment. */
export class LatencyModel {
  private readonly ranks = new Map<string, RankLatency>();
  private readonly ttftFit = new DecayedFit(3, FLEET_DECAY);
  private readonly tpotFit = new DecayedFit(3, FLEET_DECAY);
  private readonly shares: SourceShares;
  // The shape, read at each decision (refreshed by `prepare`).
  private a = 0;
  private b = 0;
  private c = 0;
  private t0 = 0;
  private t1 = 0;
  private t2 = 0;
  /** The ranks' mean ratio of TPOT speed to TTFT speed, for a rank whose TPOT is not measured yet (see `tpot`). */
  private tpotPerTtft = 1;
  private speedsStale = false;

  constructor(minSources = 3) {
    this.shares = new SourceShares(minSources);
  }

  /** The rank with key `key` (an endpoint's `upstream#rank`), made on first use. */
  rank(key: string): RankLatency {
    let rank = this.ranks.get(key);
    if (rank === undefined) this.ranks.set(key, (rank = new RankLatency()));
    return rank;
  }

  /** Whether TTFT predictions are made (enough samples for the shape). */
  get ttftWarm(): boolean {
    return this.ttftFit.samples >= WARM_SAMPLES;
  }

  get tpotWarm(): boolean {
    return this.tpotFit.samples >= WARM_SAMPLES;
  }

  /** Refreshes the shape from the fits: once per decision, before the per-candidate predictions. */
  prepare(): void {
    // Coefficients held ≥ 0: a time grows with work and load.
    this.ttftFit.refresh(true);
    const ttft = this.ttftFit.theta;
    this.a = ttft[0];
    this.b = ttft[1];
    this.c = ttft[2];
    this.tpotFit.refresh(true);
    const tpot = this.tpotFit.theta;
    this.t1 = tpot[0];
    this.t2 = tpot[1];
    this.t0 = tpot[2];
    if (this.speedsStale) this.relateSpeeds();
  }

  /** A pass over the ranks, at the next `prepare` after a sample (a sample moves a rank's speeds). */
  private relateSpeeds(): void {
    this.speedsStale = false;
    let sum = 0;
    let count = 0;
    for (const rank of this.ranks.values()) {
      if (rank.tpot.samples === 0 || rank.ttft.samples === 0) continue;
      sum += rank.tpot.factor / rank.ttft.factor;
      count++;
    }
    this.tpotPerTtft = count === 0 ? 1 : sum / count;
  }

  /** Predicted TTFT in seconds on `rank` with `work` blocks of prefill (ahead + own) and `load` requests in flight. */
  ttft(rank: RankLatency, work: number, load: number): number {
    return rank.ttft.factor * (this.a * work + this.b * load + this.c);
  }

  /**
   * Predicted TPOT in seconds on `rank` with `load` requests in flight during the decode (the
   * request's own included) and `prefillRate` uncached blocks a second sent there. The blocks a
   * step computes are that rate times the step's own time, so TPOT = base + t2 × rate × TPOT: its
   * fixed point. Before the rank's first TPOT sample, at its TTFT speed (the same
   * engine's, learned from first tokens seconds sooner) as the measured ranks relate the two. A
   * rank's TPOT is learned at a stream's end, and a slower GPU taking only long answers (the batch
   * class) showed none for its first ten seconds in `bench:slo`: predicted at the fleet's speed,
   * it drew requests with a TPOT objective it could not meet.
   */
  tpot(rank: RankLatency, load: number, prefillRate = 0): number {
    const factor = rank.tpot.samples > 0 ? rank.tpot.factor : rank.ttft.samples > 0 ? rank.ttft.factor * this.tpotPerTtft : 1;
    return (factor * (this.t0 + this.t1 * load)) / (1 - Math.min(MAX_PREFILL_SHARE, factor * this.t2 * prefillRate));
  }

  /** The source's weight for one more observation (counted). */
  weigh(source: string): number {
    return this.shares.observe(source);
  }

  /** A measured TTFT (seconds) of a request sent with `work` and `load` (as predicted with), from `source` with `weight`. */
  learnTtft(rank: RankLatency, source: string, weight: number, work: number, load: number, seconds: number): void {
    if (!(seconds >= 0) || !(work >= 0) || !(load >= 0)) return;
    const warm = this.ttftWarm;
    if (warm) this.prepare();
    const shaped = this.a * work + this.b * load + this.c;
    const predicted = rank.ttft.factor * shaped;
    const y = warm && predicted > 0 ? clip(seconds, predicted) : seconds;
    if (warm && shaped > 0) rank.ttft.learn(source, y, shaped, weight);
    this.speedsStale = true;
    if (rank.ttft.agrees(source)) this.ttftFit.add([work, load, 1], y / rank.ttft.factor, weight);
  }

  /**
   * A measured mean TPOT (seconds) of a stream with `load` requests in flight on average during
   * its decode and `prefill` uncached blocks sent to its rank per token it decoded.
   */
  learnTpot(rank: RankLatency, source: string, weight: number, load: number, prefill: number, seconds: number): void {
    if (!(seconds >= 0) || !(load >= 0) || !(prefill >= 0)) return;
    const warm = this.tpotWarm;
    if (warm) this.prepare();
    const shaped = this.t0 + this.t1 * load + this.t2 * prefill;
    const predicted = rank.tpot.factor * shaped;
    const y = warm && predicted > 0 ? clip(seconds, predicted) : seconds;
    if (warm && shaped > 0) rank.tpot.learn(source, y, shaped, weight);
    this.speedsStale = true;
    if (rank.tpot.agrees(source)) this.tpotFit.add([load, prefill, 1], y / rank.tpot.factor, weight);
  }

  /** The shape, for tracing and the docs. */
  get shape(): { a: number; b: number; c: number; t0: number; t1: number; t2: number } {
    this.prepare();
    return { a: this.a, b: this.b, c: this.c, t0: this.t0, t1: this.t1, t2: this.t2 };
  }
}

function clip(measured: number, predicted: number): number {
  return Math.min(predicted * CLIP, Math.max(predicted / CLIP, measured));
}
