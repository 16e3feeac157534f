/**
 * `bench:slo`'s oracle (`--contenders oracle`): a router that knows every queue. It sits in the
 * client, reads each rank's timed engine as it is at the moment a request is sent (the mock's
 * `schedulerState`: every running request's prompt left to compute and tokens left to sample, the
 * waiting ones), and sends the request to the mock with `x-data-parallel-rank`. For each rank it
 * runs that engine's steps forward (the scheduler's own rules and step costs, no later arrivals)
 * with and without the request, and takes:
 *
 * - with objectives: among the ranks where the request meets both and leaves every interactive
 *   stream there within the TPOT objective (or no worse than it was), the one it slows least (the
 *   sum of what it adds to their mean token time); else the least bad by its worst share;
 * - without: among the ranks where its first token comes within {@link BATCH_TTFT_MS} and it
 *   breaks no interactive stream, the one it slows least; else the soonest first token.
 *
 * What it cannot see is what comes after (arrivals, which are Poisson) and the caches: a family's
 * prompt counts as cached on a rank that was sent it within the last {@link CACHE_TOKENS} new
 * prompt tokens there (the mock's cache is a least-recently-used one of 1,500 16-token blocks).
 * Its figure is what placing each request by the engines' true state reaches on this workload:
 * an upper mark for a router that predicts that state, not a proof that none does better.
 */
import type { MockVllm } from '../../example-server/mock-vllm';
import type { SchedulerConfig } from '../../example-server/mock-vllm/scheduler';
import type { PlannedRequest } from './workload';

/** Prompt tokens, as the mock's tokenizer cuts the workload's text (docs/performance.md, "SLO routing"). */
const FAMILY_TOKENS = 912;
const QUESTION_TOKENS = 60;
const DOCUMENT_TOKENS = 1150;
/** New prompt tokens a rank may take before a family sent there is taken as evicted (24,000 fit). */
const CACHE_TOKENS = 18_000;
/** A first token later than this is a batch request kept waiting too long. */
const BATCH_TTFT_MS = 700;
/** What the HTTP hops and the step under way add to a first token, ms. */
const OVERHEAD_MS = 25;

/** The timed engine's settings the simulation follows (no CPU tier in this scenario). */
export type OracleEngine = Omit<SchedulerConfig, 'cpuLoadMsPerToken'>;

interface SimSeq {
  prefill: number;
  left: number;
  readonly interactive: boolean;
  /** Step time summed over its decode steps from now, and their count. */
  gapMs: number;
  gaps: number;
  firstMs: number;
}

interface SimResult {
  /** The new request's first token and mean token gap, ms (NaN without one). */
  ttftMs: number;
  tpotMs: number;
  /** Per interactive stream running now (in order), its mean token gap from now, ms. */
  others: number[];
}

/**
 * Runs one engine's steps from `running` and `waiting` until every interactive stream and `fresh`
 * are done: the mock scheduler's `step` and `endStep` (scheduler.ts) as a dry run, since those
 * run on timers over live requests.
 */
function simulate(engine: OracleEngine, speed: number, running: SimSeq[], waiting: SimSeq[], fresh: SimSeq | undefined): SimResult {
  const run = running.map((seq) => ({ ...seq }));
  const queue = waiting.map((seq) => ({ ...seq }));
  const watched = run.filter((seq) => seq.interactive);
  let extra: SimSeq | undefined;
  if (fresh !== undefined) queue.push((extra = { ...fresh }));
  let now = 0;
  for (let step = 0; step < 400; step++) {
    if (watched.every((seq) => seq.left === 0) && (extra === undefined || extra.left === 0)) break;
    let budget = engine.maxNumBatchedTokens;
    let prefillTokens = 0;
    const scheduled: Array<[SimSeq, number]> = [];
    for (const seq of run) {
      if (budget === 0) break;
      const tokens = seq.prefill > 0 ? Math.min(seq.prefill, budget) : 1;
      scheduled.push([seq, tokens]);
      budget -= tokens;
      if (seq.prefill > 0) prefillTokens += tokens;
    }
    while (queue.length > 0 && budget > 0 && run.length < engine.maxNumSeqs) {
      const seq = queue.shift()!;
      seq.prefill = Math.max(1, seq.prefill);
      run.push(seq);
      const tokens = Math.min(seq.prefill, budget);
      scheduled.push([seq, tokens]);
      budget -= tokens;
      prefillTokens += tokens;
    }
    if (scheduled.length === 0) break;
    const ms = (engine.stepMs + engine.stepMsPerSeq * scheduled.length + engine.prefillMsPerToken * prefillTokens) / speed;
    now += ms;
    for (const [seq, tokens] of scheduled) {
      if (seq.prefill > 0) {
        seq.prefill -= tokens;
        if (seq.prefill > 0) continue;
        seq.firstMs = now;
      } else {
        seq.gapMs += ms;
        seq.gaps++;
      }
      seq.left--;
    }
    for (let at = run.length - 1; at >= 0; at--) if (run[at].left === 0) run.splice(at, 1);
  }
  return {
    ttftMs: extra === undefined ? NaN : extra.firstMs + OVERHEAD_MS,
    tpotMs: extra === undefined || extra.gaps === 0 ? NaN : extra.gapMs / extra.gaps,
    others: watched.map((seq) => (seq.gaps === 0 ? 0 : seq.gapMs / seq.gaps)),
  };
}

function seq(prefill: number, left: number, interactive: boolean): SimSeq {
  return { prefill, left, interactive, gapMs: 0, gaps: 0, firstMs: NaN };
}

/** Places each request by the engines' state when it is sent; see the module comment. */
export class Oracle {
  /** Per rank, the new prompt tokens sent there so far, and per family the count when last sent. */
  private readonly written: number[];
  private readonly lastSent: Array<Map<number, number>>;

  constructor(
    private readonly mock: MockVllm,
    private readonly engine: OracleEngine,
    private readonly interactiveTokens: number,
    private readonly tpotObjectiveMs: number,
    private readonly ttftObjectiveMs: number,
  ) {
    this.written = engine.speeds.map(() => 0);
    this.lastSent = engine.speeds.map(() => new Map());
  }

  /** The rank `planned` goes to. */
  place(planned: PlannedRequest): number {
    const interactive = planned.kind === 'interactive';
    const own = interactive ? QUESTION_TOKENS : DOCUMENT_TOKENS;
    let best = -1;
    let bestTier = 3;
    let bestKey = Infinity;
    for (let rank = 0; rank < this.engine.speeds.length; rank++) {
      const state = this.mock.schedulerState(rank);
      if (state === undefined) throw new Error(`oracle: rank ${rank} has no timed engine`);
      const running = state.running.map((one) => seq(one.prefillLeft, one.outputTokens - one.emitted, one.outputTokens === this.interactiveTokens));
      // A waiting request's prompt is looked up when it is scheduled: taken as its own part only.
      const waiting = state.waiting.map((one) => seq(one.outputTokens === this.interactiveTokens ? QUESTION_TOKENS : DOCUMENT_TOKENS, one.outputTokens, one.outputTokens === this.interactiveTokens));
      const fresh = seq(this.promptLeft(rank, planned.family, own), planned.maxTokens, interactive);
      const speed = this.engine.speeds[rank];
      const without = simulate(this.engine, speed, running, waiting, undefined);
      const withIt = simulate(this.engine, speed, running, waiting, fresh);
      let slows = 0;
      let breaks = false;
      for (let at = 0; at < withIt.others.length; at++) {
        slows += withIt.others[at] - without.others[at];
        if (withIt.others[at] > Math.max(this.tpotObjectiveMs, without.others[at])) breaks = true;
      }
      let tier: number;
      let key: number;
      if (interactive) {
        const meets = withIt.ttftMs <= this.ttftObjectiveMs && withIt.tpotMs <= this.tpotObjectiveMs;
        tier = meets && !breaks ? 0 : meets ? 1 : 2;
        key = tier < 2 ? slows : Math.max(withIt.ttftMs / this.ttftObjectiveMs, withIt.tpotMs / this.tpotObjectiveMs);
      } else {
        tier = withIt.ttftMs <= BATCH_TTFT_MS && !breaks ? 0 : 2;
        // Slowing nobody, the slower engine first (it serves no objective), then the soonest first token.
        key = tier === 0 ? Math.round(slows * 10) * 1e6 + speed * 1e4 + withIt.ttftMs : withIt.ttftMs;
      }
      if (tier < bestTier || (tier === bestTier && key < bestKey)) {
        best = rank;
        bestTier = tier;
        bestKey = key;
      }
    }
    this.written[best] += this.promptLeft(best, planned.family, own);
    this.lastSent[best].set(planned.family, this.written[best]);
    return best;
  }

  /** The prompt tokens `rank` would compute for a request of `family` with `own` tokens after the family's prompt. */
  private promptLeft(rank: number, family: number, own: number): number {
    const cached = this.written[rank] - (this.lastSent[rank].get(family) ?? -Infinity) < CACHE_TOKENS;
    return own + (cached ? 0 : FAMILY_TOKENS);
  }
}
