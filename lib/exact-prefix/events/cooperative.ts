/**
 * Sharing the event loop with request handling. zeromq's `receive()` hands over queued
 * messages without returning to I/O, one payload can take tens of milliseconds to decode, and
 * one batch can hold thousands of blocks: work on the streams is counted, and past a slice the
 * stream waits for `setImmediate`, so that requests (and `/healthz`) are served between slices.
 */

/**
 * Work units (a block stored or removed, an event, DECODED_VALUES_PER_UNIT decoded values) done
 * before yielding: about 0.5 ms on an idle core, 1–3 ms on a loaded one (4,096 were 5–10 ms there).
 */
export const WORK_SLICE = 1_024;

/** MessagePack values decoded (or checked) for the cost of one block applied to the index. */
export const DECODED_VALUES_PER_UNIT = 8;

let spent = 0;
let yields = 0;

/** Resolves after pending I/O callbacks have run. */
export function yieldToIo(): Promise<void> {
  spent = 0;
  yields++;
  return new Promise((resolve) => setImmediate(resolve));
}

/** Counts `units` of work; yields once the slice is spent (shared by every stream of the process). */
export function spend(units: number): Promise<void> | undefined {
  spent += units;
  return spent >= WORK_SLICE ? yieldToIo() : undefined;
}

/** Counts `values` decoded, as `spend` does: the decoder's pause (decodeKvEventBatchCooperatively). */
export function spendDecoded(values: number): Promise<void> | undefined {
  return spend(values / DECODED_VALUES_PER_UNIT);
}

/** How many times the streams have yielded to I/O in this process (for tests and benchmarks). */
export function yieldCount(): number {
  return yields;
}
