/**
 * Sharing the event loop with request handling. zeromq's `receive()` hands over queued
 * messages without returning to I/O, and one batch can hold thousands of blocks: work on the
 * streams is counted, and past a slice the stream waits for `setImmediate`, so that requests
 * (and `/healthz`) are served between slices.
 */

/** Work units (a block stored or removed, an event) done before yielding; about 2 ms. */
export const WORK_SLICE = 4_096;

let spent = 0;

/** Resolves after pending I/O callbacks have run. */
export function yieldToIo(): Promise<void> {
  spent = 0;
  return new Promise((resolve) => setImmediate(resolve));
}

/** Counts `units` of work; yields once the slice is spent (shared by every stream of the process). */
export function spend(units: number): Promise<void> | undefined {
  spent += units;
  return spent >= WORK_SLICE ? yieldToIo() : undefined;
}
