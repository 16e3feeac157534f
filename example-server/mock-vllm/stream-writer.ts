import type { ServerResponse } from 'node:http';
import { dieAfterFlush } from './http';
import type { SseStream } from './openai';

/** The one pending timer of a request, cleared when the request ends however it ends. */
export class RequestTimer {
  private timer: NodeJS.Timeout | undefined;

  /** Runs `task` after `delayMs`; synchronously when there is no delay, to keep the fast path timer-free. */
  after(delayMs: number, task: () => void): void {
    if (delayMs <= 0) task();
    else this.timer = setTimeout(task, delayMs);
  }

  cancel(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}

/** Writes an SSE stream step by step, honouring the decode delay, backpressure and a die-mid-stream fault. */
export class SseWriter {
  private step = 0;
  private eventsWritten = 0;

  constructor(
    private readonly res: ServerResponse,
    private readonly stream: SseStream,
    private readonly stepDelayMs: number,
    private readonly timer: RequestTimer,
    /** Events to write before the connection dies; `Infinity` when no fault is set. */
    private readonly eventBudget: number,
  ) {}

  /** Writes steps until the stream ends, a delay is due, the socket needs draining, or the fault strikes. */
  readonly run = (): void => {
    const outcome = this.writeSteps();
    // end() only once uncorked: Node 22's end() on a corked response sends the chunked
    // terminator ahead of the chunks written since cork(), so the client's body stops short
    // (Node 24.22 flushes them first; Node 20 does not buffer them).
    if (outcome === 'done') this.res.end();
    else if (outcome === 'die') dieAfterFlush(this.res);
  };

  private writeSteps(): StepOutcome {
    const { res } = this;
    res.cork();
    try {
      while (!res.destroyed) {
        const outcome = this.writeStep();
        if (outcome !== 'written') return outcome;
        if (++this.step === this.stream.steps) return 'done';
        if (this.stepDelayMs > 0) {
          this.timer.after(this.stepDelayMs, this.run);
          return 'paused';
        }
        if (res.writableNeedDrain) {
          res.once('drain', this.run);
          return 'paused';
        }
      }
      return 'gone';
    } finally {
      // Uncork before a fault ends the socket, so the events promised before it do reach the client.
      res.uncork();
    }
  }

  private writeStep(): StepOutcome {
    for (const event of this.stream.eventsAt(this.step)) {
      if (this.res.destroyed) return 'gone';
      if (this.eventsWritten === this.eventBudget) return 'die';
      this.res.write(event);
      this.eventsWritten++;
    }
    return 'written';
  }
}

type StepOutcome = 'written' | 'paused' | 'done' | 'gone' | 'die';
