import type { RankModel } from './rank';
import { TOKENS_PER_BLOCK } from './tokens';
import type { Workload } from './workloads';

/**
 * The TTFT p99 no routing can beat on an open-loop workload at `secondsPerUnit`, in seconds, or
 * `null` for a workload whose requests wait for earlier answers (their arrivals depend on the
 * routing). Each request is given its best case: no queue, and one cache shared by every rank
 * that never evicts and holds a block from the moment the first request carrying it could have
 * finished its prefill (vLLM caches a block once computed, not while it is being computed). A
 * request's own prefill then covers the blocks of its prompt not yet held at its arrival.
 */
export function ttftFloorP99(workload: Workload, secondsPerUnit: number, model: RankModel): number | null {
  if (workload.requests.some((request) => request.follows !== undefined)) return null;
  const heldFrom = new Map<number, number>();
  const floors: number[] = [];
  for (const request of [...workload.requests].sort((a, b) => a.unitArrival - b.unitArrival)) {
    const arrival = request.unitArrival * secondsPerUnit;
    let cached = 0;
    while (cached < request.inputBlocks.length && (heldFrom.get(request.inputBlocks[cached]) ?? Infinity) <= arrival) cached++;
    // As the simulator: vLLM recomputes at least the last token even on a full hit.
    const floor = model.prefillOverheadSeconds + Math.max(1, request.inputTokens - cached * TOKENS_PER_BLOCK) / model.prefillTokensPerSecond;
    floors.push(floor);
    for (const block of request.inputBlocks) if (!((heldFrom.get(block) ?? Infinity) <= arrival + floor)) heldFrom.set(block, arrival + floor);
  }
  floors.sort((a, b) => a - b);
  // The simulator's nearest-rank percentile.
  return floors[Math.min(floors.length - 1, Math.max(0, Math.ceil(0.99 * floors.length) - 1))];
}
