import type { ServerResponse } from 'node:http';

/** One rank's seats: vLLM's `--max-num-seqs`, past which requests wait in the engine's own queue. */
interface Seats {
  running: number;
  readonly waiting: Array<() => void>;
  /** The most requests this rank held at once, running and waiting: what a gateway sent it concurrently. */
  peakConcurrent: number;
}

/**
 * The mock's per-rank concurrency limit (`maxNumSeqs`), so that a gateway's queue can be
 * watched working: a request past the limit waits, FIFO, and shows in
 * `vllm:num_requests_waiting`. Each rank also records its peak concurrency, which tests read
 * to check that a gateway never sent more than it may.
 */
export class SeqLimit {
  private readonly seats = new Map<number, Seats>();

  constructor(private readonly maxNumSeqs: number) {}

  /** Resolves when the request may run on `rank` (at once below the limit); `false` when the client left first. */
  seat(rank: number, res: ServerResponse): Promise<boolean> | boolean {
    const seats = this.of(rank);
    let seated = false;
    let wake: (() => void) | undefined;
    res.once('close', () => {
      if (seated) this.free(seats);
      else if (wake !== undefined) seats.waiting.splice(seats.waiting.indexOf(wake), 1);
    });
    seats.peakConcurrent = Math.max(seats.peakConcurrent, seats.running + seats.waiting.length + 1);
    if (seats.running < this.maxNumSeqs) {
      seated = true;
      seats.running++;
      return true;
    }
    return new Promise((resolve) => {
      wake = () => {
        seated = true;
        seats.running++;
        resolve(true);
      };
      seats.waiting.push(wake);
    });
  }

  /** Requests waiting for a seat on `rank`. */
  waiting(rank: number): number {
    return this.seats.get(rank)?.waiting.length ?? 0;
  }

  /** The most requests `rank` held at once. */
  peak(rank: number): number {
    return this.seats.get(rank)?.peakConcurrent ?? 0;
  }

  /** Zeroes the peaks (with the other counters). */
  resetPeaks(): void {
    for (const seats of this.seats.values()) seats.peakConcurrent = seats.running + seats.waiting.length;
  }

  private of(rank: number): Seats {
    let seats = this.seats.get(rank);
    if (seats === undefined) {
      seats = { running: 0, waiting: [], peakConcurrent: 0 };
      this.seats.set(rank, seats);
    }
    return seats;
  }

  private free(seats: Seats): void {
    seats.running--;
    seats.waiting.shift()?.();
  }
}
