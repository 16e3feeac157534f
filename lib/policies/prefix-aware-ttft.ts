import type { Endpoint } from '../types';
import { DecayedFit } from './decayed-fit';

/**
 * What dpRouter keeps on each endpoint for a policy with `learnsFirstTokens` (`prefix-aware`):
 * running totals since the endpoint was created, so that a policy reading them at its next pick
 * learns every answer in between. Optional: without them (dpRank, a non-streamed answer) the
 * policy counts a request's prefill as waiting until the request leaves `inflight`.
 */
export interface FirstTokenTotals {
  /** 2xx event streams whose first event arrived, of requests this router dispatched here. */
  readonly firstTokens?: number;
  /** The sum of their times from dispatch to first token, in seconds. */
  readonly firstTokenSeconds?: number;
}

/**
 * What dpRouter keeps on each endpoint where `peers` is on: the other gateway replicas' share of
 * the endpoint's load, as they last announced it. A policy reads it as load it did not send but
 * knows in full, so it is not priced as load feedback's unknown load is.
 */
export interface PeerLoad {
  /** Requests the other replicas dispatched here and have not finished (included in `load`). */
  readonly peerInflight?: number;
  /**
   * Prefill those requests still wait for, in the announcing policies' blocks: the uncached
   * blocks of the ones without a first token yet (every replica must run the same settings).
   */
  readonly peerBlocks?: number;
}

/** Samples the fit needs before it replaces the prior. */
const MIN_SAMPLES = 16;
/** Weight of older samples after each new one: the fit follows about the last 256 first tokens. */
const SAMPLE_DECAY = 1 - 1 / 256;

/**
 * Time to first token against the work ahead of a request, learned online: `seconds ≈ a ×
 * blocks + b × load + c`, where `blocks` is the uncached prefill waiting on the endpoint when
 * the request was sent plus its own, and `load` the endpoint's load then (slots taken, queue
 * the router cannot price in blocks). A least-squares fit over exponentially decayed sums;
 * only `b / a` matters to a pick (the blocks one more unit of load is worth), so that is what
 * it returns. Before {@link MIN_SAMPLES} samples, or while the fit is not sane (`a ≤ 0`), it
 * returns the prior: 0 (the waiting blocks alone predict).
 */
export class PrefillCostModel {
  /** Over x = [blocks, load, count], y = seconds. */
  private readonly fit = new DecayedFit(3, SAMPLE_DECAY);
  /** First tokens learned (a sample may count several). */
  samples = 0;
  private ratio = 0;
  /** The fitted seconds per block (0 until fitted): for tracing and the docs. */
  secondsPerBlock = 0;

  /**
   * `count` requests got their first tokens `seconds` after dispatch in total; `blocks` and
   * `load` are the sums of their dispatch-time features.
   */
  learn(blocks: number, load: number, count: number, seconds: number): void {
    if (!(seconds >= 0) || count <= 0) return;
    this.fit.add([blocks, load, count], seconds);
    this.samples += count;
  }

  /** Blocks of prefill one unit of load is worth. */
  blocksPerLoad(): number {
    // Unconstrained: a load that seems to cost nothing (b < 0) is priced at 0 below, not refitted away.
    if (this.samples < MIN_SAMPLES || !this.fit.refresh(false)) return this.ratio;
    const [a, b] = this.fit.theta;
    if (a > 0 && Number.isFinite(b)) {
      this.secondsPerBlock = a;
      this.ratio = Math.max(0, b / a);
    }
    return this.ratio;
  }
}

/**
 * One endpoint's prefill waiting, as this policy sent it: a FIFO of the uncached blocks of the
 * requests it routed there that have not given their first token (an engine prefills in
 * arrival order, so first tokens come back in that order), with each request's features at
 * dispatch for the cost model.
 */
export class PendingPrefill {
  /** The sum of the queued requests' own blocks. */
  blocks = 0;
  private own = new Float64Array(8);
  private ahead = new Float64Array(8);
  private loads = new Float64Array(8);
  private head = 0;
  private count = 0;
  private seenTokens = 0;
  private seenSeconds = 0;
  private primed = false;

  /**
   * Drops what has left the queue since the last look: the oldest entries, one per first token
   * the endpoint reported (each batch a sample for `model`), then any beyond its in-flight count
   * (requests that ended without a first token, or whose first tokens are not reported).
   */
  settle(endpoint: Endpoint & FirstTokenTotals, model: PrefillCostModel): void {
    const tokens = endpoint.firstTokens;
    if (tokens !== undefined) {
      const seconds = endpoint.firstTokenSeconds ?? 0;
      if (!this.primed) {
        // Answers from before this policy saw the endpoint are not in its queue.
        this.primed = true;
      } else if (tokens > this.seenTokens) {
        const answered = tokens - this.seenTokens;
        const taken = Math.min(answered, this.count);
        let ahead = 0;
        let load = 0;
        for (let i = 0; i < taken; i++) {
          const at = this.head;
          ahead += this.ahead[at];
          load += this.loads[at];
          this.shift();
        }
        // Answers to requests it did not send (hinted ones) make the pairing unsure: no sample.
        if (taken === answered) model.learn(ahead, load, answered, seconds - this.seenSeconds);
      }
      this.seenTokens = tokens;
      this.seenSeconds = seconds;
    }
    const inflight = endpoint.inflight;
    while (this.count > inflight) this.shift();
  }

  /** A request sent with `own` uncached blocks, `ahead` blocks waiting before it (its own included) and `load` on the endpoint. */
  push(own: number, ahead: number, load: number): void {
    if (this.count === this.own.length) this.grow();
    const at = (this.head + this.count) % this.own.length;
    this.own[at] = own;
    this.ahead[at] = ahead;
    this.loads[at] = load;
    this.count++;
    this.blocks += own;
  }

  private shift(): void {
    this.blocks -= this.own[this.head];
    this.head = (this.head + 1) % this.own.length;
    this.count--;
    if (this.count === 0) this.blocks = 0;
  }

  private grow(): void {
    const size = this.own.length * 2;
    const reorder = (from: Float64Array) => {
      const to = new Float64Array(size);
      for (let i = 0; i < this.count; i++) to[i] = from[(this.head + i) % from.length];
      return to;
    };
    this.own = reorder(this.own);
    this.ahead = reorder(this.ahead);
    this.loads = reorder(this.loads);
    this.head = 0;
  }
}
