/**
 * The mock's timed engine (`scheduler` option): each rank runs requests in steps as vLLM 52a31cc's
 * scheduler does (vllm/v1/core/sched/scheduler.py), so that what a router can observe (time to
 * first token, time per output token, `vllm:num_requests_running|waiting`) responds to load and
 * to the prefix cache the way a real engine's does:
 *
 * - a step first gives every running request its tokens, a decode one token and a request still
 *   prefilling its next chunk (scheduler.py:364-498), then admits waiting requests in arrival
 *   order while the step's token budget (`--max-num-batched-tokens`, scheduler.py:348, 548) and
 *   the running limit (`--max-num-seqs`, scheduler.py:549-550) allow;
 * - a request's prefix-cache hits are looked up when it is first scheduled, not when it arrives
 *   (`get_computed_blocks`, then the connector's `get_num_new_matched_tokens`: scheduler.py:591-621),
 *   and only the rest is computed, chunked by the budget (chunked prefill, on by default:
 *   config/scheduler.py:84; scheduler.py:669);
 * - the last prompt token is always computed, cached or not (`max_cache_hit_length = num_tokens - 1`,
 *   vllm/v1/core/kv_cache_manager.py:219); the blocks a step schedules are cached (and their
 *   `BlockStored` events taken) in the step that allocates them (kv_cache_manager.py:421-425),
 *   published as the step's batch (scheduler.py:1554-1567);
 * - the step that computes a request's last prompt token samples its first output token, and each
 *   later step one more (no speculative decoding);
 * - how long a step takes is the mock's model, not vLLM's code: a fixed cost, a cost per
 *   sequence in the batch (so decode slows as the running batch grows), a cost per prompt token
 *   computed, and a smaller one per token loaded from the CPU tier, all divided by the rank's
 *   speed (a slower GPU, a noisy neighbour).
 */
import type { MockSchedulerOptions, SchedulerState } from './types';

/** The timed engine's settings, resolved. */
export interface SchedulerConfig {
  /** Each engine's speed, in local-index order (1: nominal; 0.5: every step takes twice as long). */
  speeds: readonly number[];
  stepMs: number;
  stepMsPerSeq: number;
  prefillMsPerToken: number;
  cpuLoadMsPerToken: number;
  maxNumBatchedTokens: number;
  maxNumSeqs: number;
}

/** What the timed engine needs from one request. */
export interface SchedulerJob {
  /** Output tokens to produce (`max_tokens`). */
  readonly outputTokens: number;
  /**
   * Called once, when the request is first scheduled: runs its prompt through the caches and
   * says what is left to do (every prompt token is either cached, loaded or computed).
   */
  admit(): { promptTokens: number; cachedTokens: number; cpuCachedTokens: number };
  /** Output token `index` was sampled at the end of a step (0: the first token). */
  onToken(index: number): void;
}

/** A request the scheduler holds, and how far it got. */
interface Seq {
  readonly job: SchedulerJob;
  /** Prompt tokens still to compute; -1 before the request was first scheduled. */
  prefillLeft: number;
  /** Prompt tokens to load from the CPU tier in its first step. */
  loadTokens: number;
  emitted: number;
  cancelled: boolean;
}

/** A handle to cancel a submitted request (the client left). */
export interface SubmittedJob {
  cancel(): void;
}

/** One rank's scheduler: a waiting queue, a running batch, and the one timer of its current step. */
class RankScheduler {
  private readonly waiting: Seq[] = [];
  private running: Seq[] = [];
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly config: SchedulerConfig,
    private readonly speed: number,
  ) {}

  get waitingCount(): number {
    return this.waiting.length;
  }

  inspect(): SchedulerState {
    return {
      running: this.running.filter((seq) => !seq.cancelled).map((seq) => ({ prefillLeft: Math.max(0, seq.prefillLeft), emitted: seq.emitted, outputTokens: seq.job.outputTokens })),
      waiting: this.waiting.map((seq) => ({ outputTokens: seq.job.outputTokens })),
    };
  }

  submit(job: SchedulerJob): SubmittedJob {
    const seq: Seq = { job, prefillLeft: -1, loadTokens: 0, emitted: 0, cancelled: false };
    this.waiting.push(seq);
    if (this.timer === undefined) this.step();
    return {
      cancel: () => {
        seq.cancelled = true;
        const at = this.waiting.indexOf(seq);
        if (at >= 0) this.waiting.splice(at, 1);
      },
    };
  }

  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Plans one step and sets the timer of its end; idles when there is nothing to run. */
  private step(): void {
    this.running = this.running.filter((seq) => !seq.cancelled);
    if (this.running.length === 0 && this.waiting.length === 0) {
      this.timer = undefined;
      return;
    }
    const { config } = this;
    let budget = config.maxNumBatchedTokens;
    let computed = 0;
    let loaded = 0;
    const scheduled: Array<[Seq, number]> = [];
    for (const seq of this.running) {
      if (budget === 0) break;
      const tokens = seq.prefillLeft > 0 ? Math.min(seq.prefillLeft, budget) : 1;
      scheduled.push([seq, tokens]);
      budget -= tokens;
      computed += tokens;
    }
    while (this.waiting.length > 0 && budget > 0 && this.running.length < config.maxNumSeqs) {
      const seq = this.waiting.shift()!;
      const { promptTokens, cachedTokens, cpuCachedTokens } = seq.job.admit();
      // vLLM always computes at least the last prompt token (the caches never hit it).
      seq.prefillLeft = Math.max(1, promptTokens - cachedTokens - cpuCachedTokens);
      seq.loadTokens = cpuCachedTokens;
      loaded += cpuCachedTokens;
      const tokens = Math.min(seq.prefillLeft, budget);
      this.running.push(seq);
      scheduled.push([seq, tokens]);
      budget -= tokens;
      computed += tokens;
    }
    const prefillTokens = computed - scheduled.filter(([seq]) => seq.prefillLeft === 0).length;
    const ms = (config.stepMs + config.stepMsPerSeq * scheduled.length + config.prefillMsPerToken * prefillTokens + config.cpuLoadMsPerToken * loaded) / this.speed;
    this.timer = setTimeout(() => this.endStep(scheduled), ms);
  }

  /** Samples a token for every request whose prompt is done, retires the finished, and plans the next step. */
  private endStep(scheduled: ReadonlyArray<[Seq, number]>): void {
    const finished = new Set<Seq>();
    for (const [seq, tokens] of scheduled) {
      if (seq.cancelled) continue;
      if (seq.prefillLeft > 0) {
        seq.prefillLeft -= tokens;
        if (seq.prefillLeft > 0) continue;
      }
      seq.job.onToken(seq.emitted++);
      if (seq.emitted === seq.job.outputTokens) finished.add(seq);
    }
    if (finished.size > 0) this.running = this.running.filter((seq) => !finished.has(seq));
    this.step();
  }
}

/** Every rank's scheduler, by local engine index. */
export class MockScheduler {
  private readonly ranks: RankScheduler[];

  constructor(config: SchedulerConfig) {
    this.ranks = config.speeds.map((speed) => new RankScheduler(config, speed));
  }

  /** Queues `job` on the engine of local index `local`. */
  submit(local: number, job: SchedulerJob): SubmittedJob {
    return this.ranks[local].submit(job);
  }

  /** What engine `local` holds now (a bench's oracle reads it). */
  inspect(local: number): SchedulerState {
    return this.ranks[local].inspect();
  }

  /** Requests waiting to be scheduled on engine `local` (`vllm:num_requests_waiting`). */
  waiting(local: number): number {
    return this.ranks[local].waitingCount;
  }

  close(): void {
    for (const rank of this.ranks) rank.close();
  }
}

/** Fills the defaults of the `scheduler` option for `engines` engines; throws a TypeError naming the field. */
export function resolveSchedulerOptions(options: MockSchedulerOptions, engines: number, maxNumSeqs: number): SchedulerConfig {
  const path = 'startMockVllm: scheduler';
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new TypeError(`${path} must be an object such as { speeds: [1, 1, 0.5, 0.5] } or {} for the defaults, got ${String(options)}`);
  }
  for (const key of Object.keys(options)) {
    if (!SCHEDULER_KEYS.includes(key)) throw new TypeError(`${path}.${key} is not an option; known: ${SCHEDULER_KEYS.join(', ')}`);
  }
  const speeds = options.speeds ?? 1;
  const list = typeof speeds === 'number' ? Array.from({ length: engines }, () => speeds) : speeds;
  if (!Array.isArray(list) || list.length !== engines || list.some((speed) => typeof speed !== 'number' || !(speed > 0) || !Number.isFinite(speed))) {
    throw new TypeError(`${path}.speeds must be a number > 0 or one per engine (${engines}), such as [${Array.from({ length: engines }, (_, i) => (i < engines - 2 ? 1 : 0.5)).join(', ')}], got ${JSON.stringify(speeds)}`);
  }
  const prefillMsPerToken = options.prefillMsPerToken ?? 0.05;
  const config: SchedulerConfig = {
    speeds: list,
    stepMs: options.stepMs ?? 10,
    stepMsPerSeq: options.stepMsPerSeq ?? 0.25,
    prefillMsPerToken,
    // Loading a block from host memory costs about a sixth of recomputing it (issue 47's model).
    cpuLoadMsPerToken: options.cpuLoadMsPerToken ?? prefillMsPerToken / 6,
    maxNumBatchedTokens: options.maxNumBatchedTokens ?? 2048,
    maxNumSeqs: maxNumSeqs === Infinity ? 256 : maxNumSeqs,
  };
  for (const name of ['stepMs', 'stepMsPerSeq', 'prefillMsPerToken', 'cpuLoadMsPerToken'] as const) {
    if (typeof config[name] !== 'number' || !(config[name] >= 0) || !Number.isFinite(config[name])) {
      throw new TypeError(`${path}.${name} must be a finite number of ms >= 0, got ${String(config[name])}`);
    }
  }
  if (config.stepMs + config.stepMsPerSeq === 0) throw new TypeError(`${path}: stepMs and stepMsPerSeq cannot both be 0 (a step takes time)`);
  if (!Number.isSafeInteger(config.maxNumBatchedTokens) || config.maxNumBatchedTokens < 1) {
    throw new TypeError(`${path}.maxNumBatchedTokens must be an integer >= 1, got ${String(config.maxNumBatchedTokens)}`);
  }
  return config;
}

const SCHEDULER_KEYS = ['speeds', 'stepMs', 'stepMsPerSeq', 'prefillMsPerToken', 'cpuLoadMsPerToken', 'maxNumBatchedTokens'];
