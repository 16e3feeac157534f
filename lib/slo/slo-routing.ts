/**
 * SLO-aware routing at run time: each request's objectives (from the `slo` option and trusted
 * headers), the choice among the prefix-aware policy's candidates ({@link chooseWithObjectives}),
 * and what the router learns from each streamed answer (docs/slo-routing.md).
 */
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { sendError } from '../errors';
import type { PrefixPickContext } from '../policies/prefix-aware';
import { isEventStreamMediaType } from '../http/media-type';
import { modelledExactly, sourceOf } from './evidence';
import type { PickSteer } from '../policies/pick-steer';
import type { Endpoint } from '../types';
import { chooseWithObjectives, SloEstimates, type Objectives, type SloChoice } from './choose';
import { LatencyModel, type RankLatency } from './latency-model';
import type { LabelledEndpoint, SloMetrics } from './metrics';
import { MAX_OBJECTIVE_MS, TPOT_HEADER, TTFT_HEADER, type SloConfig } from './options';
import { meanTokenGap, watchStream, type StreamTiming } from './stream-timing';
import { PrefillSteer, type PrefillPrediction } from './prefill-steer';

/** Token gaps a stream must show before its mean teaches the model (`max_tokens: 2` says little of decode speed). */
export const MIN_TOKENS = 8;
/** An objective header's value: a plain decimal of milliseconds, as the rank header's grammar. */
const OBJECTIVE = /^(0|[1-9][0-9]{0,9})$/;

/** What the policy's pick asks of SLO routing (`ctx.slo`, see `PrefixPickContext`): −1 from `steer` sheds the request. */
export interface SloSteer extends PickSteer {
  readonly estimates: SloEstimates;
}

type Measured = LabelledEndpoint & { readonly load: number };

/** One request's objectives, the prediction made for it, and what it teaches. */
export class SloTicket implements SloSteer, Objectives {
  /** Objectives in seconds; 0 for none. */
  ttft = 0;
  tpot = 0;
  /** Who sent it (evidence.ts `sourceOf`). */
  source = '';
  /** Whether its timings may teach the model (evidence.ts `modelledExactly`). */
  evidence = false;
  /** Where it was predicted for, and with what. */
  endpoint: Measured | undefined = undefined;
  rank: RankLatency | undefined = undefined;
  work = 0;
  load = 0;
  predictedTtft = NaN;
  predictedTpot = NaN;
  /** No rank was predicted to meet its objectives, and `slo.shed` is on. */
  shed = false;
  /** Disaggregated: the decode rank's part of the TTFT as predicted (seconds; NaN when cold), the prefill leg's prediction and measured duration. */
  decodeWait = NaN;
  private prefill: PrefillPrediction | undefined = undefined;
  private prefillSeconds = NaN;
  private disaggregated = false;
  /** The decision header's note as the decode pick wrote it (replaced by the pair's). */
  private decodeNote = '';
  /** The uncached blocks counted as sent to `rank` (its prefill rate), until taken back, and when (seconds). */
  private sentBlocks = 0;
  private sentAt = 0;
  private loadAtFirst = 0;
  private prefilledAtFirst = 0;
  private firstSeconds = NaN;
  private counted = false;

  constructor(private readonly routing: SloRouting) {}

  get estimates(): SloEstimates {
    return this.routing.estimates;
  }

  get hasObjectives(): boolean {
    return this.ttft > 0 || this.tpot > 0;
  }

  steer(candidates: readonly Endpoint[], count: number, bestAt: number): number {
    const { routing } = this;
    const est = routing.estimates;
    for (let at = 0; at < count; at++) {
      const rank = routing.model.rank(candidates[at].key);
      est.ranks[at] = rank;
      est.tightest[at] = rank.tightestTpot;
    }
    est.now = performance.now() / 1000;
    const choice = chooseWithObjectives(routing.model, est, count, this, bestAt, routing.choice);
    const at = choice.at;
    this.endpoint = candidates[at] as unknown as Measured;
    this.rank = est.ranks[at];
    this.work = est.ahead[at] + est.uncached[at];
    this.load = est.load[at];
    this.predictedTtft = choice.predicted ? est.ttft[at] : NaN;
    this.predictedTpot = choice.predicted && routing.model.tpotWarm ? est.tpot[at] : NaN;
    this.decodeWait = this.predictedTtft;
    if (!choice.meets && routing.config.shed && this.hasObjectives) {
      this.shed = true;
      return -1;
    }
    // Counted as it goes, so that the next picks see it; taken back if no engine computes it.
    this.sentBlocks = est.uncached[at];
    this.sentAt = est.now;
    this.rank.sent(this.sentBlocks, est.now);
    return at;
  }

  /** What the decision header adds (`exposeDecision`): the predicted TTFT at the chosen rank, when one was made. */
  get note(): string {
    return (this.decodeNote = this.ttftNote());
  }

  private ttftNote(): string {
    return Number.isNaN(this.predictedTtft) ? '' : `; predicted_ttft_ms=${Math.round(this.predictedTtft * 1000)}`;
  }

  /**
   * The request is disaggregated: its prompt is computed on a prefill rank, not on the decode
   * rank it was counted at (the decode pick comes first), whose streams then share no steps with it.
   */
  prefillsElsewhere(): void {
    this.disaggregated = true;
    this.takeBack();
  }

  /** Takes the blocks counted at the rank back (once). */
  private takeBack(): void {
    const { rank, sentBlocks } = this;
    if (rank === undefined || sentBlocks === 0) return;
    this.sentBlocks = 0;
    rank.withdraw(sentBlocks, this.sentAt, performance.now() / 1000);
  }

  /**
   * The request's response closed: without a 2xx answer (the engine refused it, or none came) its
   * prompt was not computed where it was counted. Else one client's requests that vLLM refuses
   * would keep a rank's prefill rate up, and the predicted TPOT there, for every client: a prompt
   * past the context length, say, which vLLM 52a31cc refuses while rendering it, before the engine
   * sees it (vllm/renderers/params.py:324-348 and 415-437, `VLLMValidationError`), with a 400
   * (vllm/entrypoints/utils.py:361-366).
   */
  closed(answer: IncomingMessage | null | undefined): void {
    const status = answer?.statusCode ?? 0;
    if (status < 200 || status >= 300) this.takeBack();
  }

  /**
   * The steer of a disaggregated request's prefill pick (lib/slo/prefill-steer.ts), for the decode
   * rank it holds (a retry's pick goes where the policy says, unsteered). Without objectives the
   * policy's choice stands: the pair's TTFT is only predicted, and the prefill rank learns.
   */
  prefillSteer(): PrefillSteer {
    const { routing } = this;
    this.disaggregated = true;
    return new PrefillSteer(routing.prefillModel, routing.prefillEstimates, routing.choice, this, (choice, prediction, ttft) => {
      this.prefill = prediction;
      if (!choice.predicted) return choice.at;
      this.predictedTtft = ttft;
      if (!choice.meets && routing.config.shed && this.hasObjectives) {
        this.shed = true;
        return -1;
      }
      return choice.at;
    });
  }

  /** The decision header with the pair's predicted TTFT in place of the decode rank's own. */
  withPairNote(header: string): string {
    if (this.prefill === undefined) return header;
    const pair = this.ttftNote();
    return this.decodeNote === '' ? header + pair : header.replace(this.decodeNote, pair);
  }

  /** The prefill leg at `endpoint` answered (`ok`: with a success) `seconds` after it was sent: its prefill rank learns from it. */
  prefilled(endpoint: Endpoint, seconds: number, ok: boolean): void {
    const prefill = this.prefill;
    this.disaggregated = true;
    if (ok) this.prefillSeconds = seconds;
    if (!ok || !this.evidence || prefill === undefined || prefill.rank === undefined || prefill.endpoint !== endpoint) return;
    const model = this.routing.prefillModel;
    model.learnTtft(prefill.rank, this.source, model.weigh(this.source), prefill.work, prefill.load, seconds);
  }

  /** Answers a request shed at its prefill pick (503 with `Retry-After`). */
  answerShed(res: ServerResponse): void {
    this.routing.answerShed(res, this);
  }

  /** Seconds a shed request is told to wait: the least predicted time to first token, at least 1. */
  get retryAfter(): number {
    return Math.max(1, Math.ceil(Number.isFinite(this.predictedTtft) ? this.predictedTtft : 1));
  }

  /** The upstream began to answer `endpoint` (a retry may have moved the request from the predicted one). */
  answered(endpoint: Measured, answer: IncomingMessage, res: ServerResponse, started: number): void {
    const status = answer.statusCode ?? 0;
    if (status < 200 || status >= 300 || !isEventStreamMediaType(answer.headers['content-type'])) return;
    if (endpoint !== this.endpoint) {
      // A retry took it elsewhere: its prompt is computed there.
      const blocks = this.sentBlocks;
      if (blocks !== 0 && this.rank !== undefined) {
        const now = performance.now() / 1000;
        this.rank.withdraw(blocks, this.sentAt, now);
        this.routing.model.rank(endpoint.key).sent(blocks, now);
        this.sentAt = now;
      }
      this.rank = undefined;
    }
    this.endpoint = endpoint;
    watchStream(answer, res, (timing, complete) => this.ended(timing, complete, started));
  }

  /** The stream's first event arrived `seconds` after dispatch (the forwarder's first-token report). */
  firstToken(seconds: number): void {
    if (!Number.isNaN(this.firstSeconds)) return;
    this.firstSeconds = seconds;
    const { routing, rank, endpoint } = this;
    if (endpoint === undefined) return;
    this.loadAtFirst = endpoint.load;
    this.prefilledAtFirst = routing.model.rank(endpoint.key).prefilled;
    if (this.tpot > 0) routing.model.rank(endpoint.key).decoding(this.tpot, +1);
    if (!Number.isNaN(this.predictedTtft)) routing.metrics.predictionError(endpoint.upstream, 'ttft', Math.abs(seconds - this.predictedTtft));
    // Disaggregated, the decode rank's part is what follows the prefill leg's answer (the KV transfer, the queue, a first step).
    const own = this.disaggregated ? seconds - this.prefillSeconds : seconds;
    if (this.evidence && rank !== undefined && own >= 0) routing.model.learnTtft(rank, this.source, routing.model.weigh(this.source), this.work, this.load, own);
  }

  private ended(timing: StreamTiming, complete: boolean, started: number): void {
    const { routing, endpoint } = this;
    if (endpoint === undefined) return;
    if (timing.firstAt > 0 && Number.isNaN(this.firstSeconds)) this.firstToken((timing.firstAt - started) / 1000);
    if (Number.isNaN(this.firstSeconds)) return;
    if (this.tpot > 0) routing.model.rank(endpoint.key).decoding(this.tpot, -1);
    const gap = meanTokenGap(timing, 1);
    if (complete && !Number.isNaN(gap)) {
      if (!Number.isNaN(this.predictedTpot)) routing.metrics.predictionError(endpoint.upstream, 'tpot', Math.abs(gap - this.predictedTpot));
      const rank = this.rank;
      if (this.evidence && rank !== undefined && !timing.backpressured && timing.after >= MIN_TOKENS) {
        const prefill = (routing.model.rank(endpoint.key).prefilled - this.prefilledAtFirst) / timing.after;
        routing.model.learnTpot(rank, this.source, routing.model.weigh(this.source), (this.loadAtFirst + endpoint.load) / 2, prefill, gap);
      }
    }
    if (!this.hasObjectives || this.counted) return;
    this.counted = true;
    const missedTtft = this.ttft > 0 && this.firstSeconds > this.ttft;
    const missedTpot = this.tpot > 0 && !Number.isNaN(gap) && gap > this.tpot;
    routing.metrics.outcome(endpoint, missedTtft ? 'missed_ttft' : missedTpot ? 'missed_tpot' : 'met');
  }
}

/** One router's SLO routing: the model, the metrics, and each request's ticket. */
export class SloRouting {
  readonly model: LatencyModel;
  readonly estimates = new SloEstimates();
  readonly choice: SloChoice = { at: 0, meets: true, predicted: false };
  /** The prefill pool's ranks (disaggregation): their own shape and speeds, learned from the prefill legs' durations. */
  readonly prefillModel: LatencyModel;
  readonly prefillEstimates = new SloEstimates();

  constructor(
    readonly config: SloConfig,
    readonly metrics: SloMetrics,
    minSources = 3,
  ) {
    this.model = new LatencyModel(minSources);
    this.prefillModel = new LatencyModel(minSources);
  }

  /**
   * The request's objectives: a trusted caller's headers, else the defaults. The headers are
   * removed whoever sent them, so that an untrusted value never reaches the engine or its logs.
   */
  ticket(headers: IncomingHttpHeaders, trusted: boolean): SloTicket {
    const ticket = new SloTicket(this);
    const { config } = this;
    ticket.ttft = config.ttftMs / 1000;
    ticket.tpot = config.tpotMs / 1000;
    const ttft = headers[TTFT_HEADER];
    const tpot = headers[TPOT_HEADER];
    if (ttft !== undefined) {
      if (trusted) ticket.ttft = objective(ttft, ticket.ttft);
      delete headers[TTFT_HEADER];
    }
    if (tpot !== undefined) {
      if (trusted) ticket.tpot = objective(tpot, ticket.tpot);
      delete headers[TPOT_HEADER];
    }
    return ticket;
  }

  /** Whether the caller may set objectives (`slo.trust`); a trust function's throw is the caller's to pass on. */
  trusts(req: IncomingMessage): boolean {
    const { trust } = this.config;
    return trust === true || (trust !== false && trust(req) === true);
  }

  /** 503 with `Retry-After` for a request no rank is predicted to serve within its objectives, counted against the least bad rank. */
  answerShed(res: ServerResponse, ticket: SloTicket): void {
    if (ticket.endpoint !== undefined) this.metrics.outcome(ticket.endpoint, 'shed');
    res.setHeader('retry-after', String(ticket.retryAfter));
    sendError(res, 503, 'ServiceUnavailableError', 'No data-parallel rank is predicted to meet the request\'s latency objectives.');
  }
}

/** What the request path holds that SLO routing reads: the admission ticket's tenant, the headers. */
interface SloRoute {
  readonly ticket?: { readonly tenant: string; deadline: number } | undefined;
  readonly headers: IncomingHttpHeaders;
}

/** The pick context with the request's objectives, once its source and whether it is evidence are judged. */
export function sloPicking(ticket: SloTicket, picking: PrefixPickContext, req: IncomingMessage, route: SloRoute, body: Buffer | undefined, members: Readonly<Record<string, unknown>> | undefined): PrefixPickContext {
  ticket.source = sourceOf(req, route.headers, route.ticket?.tenant);
  ticket.evidence = modelledExactly(body, members);
  // Under admission, the queue serves a tenant's requests earliest deadline first (fair-queue.ts).
  if (route.ticket !== undefined && ticket.ttft > 0) route.ticket.deadline = performance.now() + ticket.ttft * 1000;
  return { ...picking, slo: ticket };
}

/** A header's objective in seconds, or `fallback` for a value that is not one (malformed, repeated, past an hour). */
function objective(raw: string | string[], fallback: number): number {
  if (typeof raw !== 'string' || !OBJECTIVE.test(raw)) return fallback;
  const ms = Number(raw);
  return ms <= MAX_OBJECTIVE_MS ? ms / 1000 : fallback;
}
