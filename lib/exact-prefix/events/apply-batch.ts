/**
 * One payload of a rank's stream applied to the index: decoded in slices, refused when it
 * names another rank, and its events applied a slice at a time, with the counts told.
 */
import { decodeKvEventBatchCooperatively, type KvBlockStored, type KvEvent } from './decode';
import { WORK_SLICE, spend, spendDecoded } from './cooperative';
import type { RankStream, StreamContext } from './rank-stream';

/** Decodes `payload` (sequence `seq`) and applies it to `stream`'s rank, yielding to I/O past each work slice. */
export async function applyPayload(context: StreamContext, stream: RankStream, seq: number, payload: Uint8Array): Promise<void> {
  const { sink } = context;
  stream.lastSeq = seq;
  const decoded = await decodeKvEventBatchCooperatively(payload, context.limits, spendDecoded);
  if (context.closed()) return;
  const rank = stream.rank;
  if (!decoded.ok) {
    // Refused whole (past the bounds, or not a batch): the index keeps what it knew. What the
    // batch stored is not indexed (nor what is chained onto it later); a removal it held is
    // missed, a claim the receipts' verdicts catch should it matter. Clearing instead would
    // leave the rank routed on nothing for every batch refused.
    context.tell(stream, (listener) => listener.event?.(rank, 'invalid', 1));
    return;
  }
  const { batch } = decoded;
  if (batch.dataParallelRank !== null && batch.dataParallelRank !== rank) {
    const reported = batch.dataParallelRank;
    context.tell(stream, (listener) => listener.rankMismatch?.(rank, reported));
    context.tell(stream, (listener) => listener.event?.(rank, 'invalid', 1));
    return;
  }
  let stored = 0;
  let removed = 0;
  let cleared = 0;
  let invalid = batch.invalidEvents;
  for (const event of batch.events) {
    // Another tier's events (an offloading connector's CPU blocks) go to the index's lower
    // tiers and count as the GPU's do: valid events, whatever their shape (tier-index.ts).
    let ok = true;
    for (const part of slices(event)) {
      if (!sink.applyEvent(rank, part)) ok = false;
      const wait = spend(part.type === 'cleared' ? 1 : part.blockHashes.length + 1);
      if (wait !== undefined) await wait;
      if (context.closed()) return;
    }
    if (!ok) invalid++;
    else if (event.type === 'stored') stored++;
    else if (event.type === 'removed') removed++;
    else cleared++;
  }
  if (stored > 0) context.tell(stream, (listener) => listener.event?.(rank, 'stored', stored));
  if (removed > 0) context.tell(stream, (listener) => listener.event?.(rank, 'removed', removed));
  if (cleared > 0) context.tell(stream, (listener) => listener.event?.(rank, 'cleared', cleared));
  if (invalid > 0) context.tell(stream, (listener) => listener.event?.(rank, 'invalid', invalid));
}

/** A stored event cut into parts of at most WORK_SLICE blocks, each chained onto the last block of the one before, so one event can be applied between yields. */
export function* slices(event: KvEvent): Generator<KvEvent> {
  // A store with masked blocks cannot be cut by position (the index skips it whole).
  if (event.type !== 'stored' || event.blockHashes.length <= WORK_SLICE || event.tokenIds.length !== event.blockHashes.length * event.blockSize) {
    yield event;
    return;
  }
  const size = event.blockSize;
  for (let start = 0; start < event.blockHashes.length; start += WORK_SLICE) {
    const end = Math.min(event.blockHashes.length, start + WORK_SLICE);
    const part: KvBlockStored = {
      ...event,
      blockHashes: event.blockHashes.slice(start, end),
      parentBlockHash: start === 0 ? event.parentBlockHash : event.blockHashes[start - 1],
      tokenIds: event.tokenIds.slice(start * size, end * size),
      extraKeyed: event.extraKeyed === null ? null : event.extraKeyed.slice(start, end),
    };
    yield part;
    // A block whose hash took extra keys ends the chain: the parts after it have no parent here.
    if (event.extraKeyed !== null && event.extraKeyed.slice(start, end).some(Boolean)) return;
  }
}
