/**
 * The sequence bookkeeping of a rank's stream, which keeps the index honest:
 * - Every message is `[topic, seq (8 bytes, big-endian), payload]`. The next expected
 *   sequence is the last one plus one; a jump forward is a gap, repaired by asking the
 *   rank's replay ROUTER for everything from the first missing sequence (replay-client.ts).
 *   Live messages that arrive meanwhile wait, in order. Any hole (in the live sequence, at
 *   the start of a replay or inside one) clears the rank there: a missed removal would
 *   otherwise claim blocks the engine no longer holds.
 * - **Sync**: when a rank's connection comes up (the first time, and after every reconnect),
 *   after an engine restart (its sequence went backwards) and after a gap a replay could not
 *   close, the rank is cleared and rebuilt from the engine's whole replay buffer (a replay from
 *   sequence 0; vLLM keeps `buffer_steps`, 10,000 batches by default). Clearing alone would
 *   wedge the rank: the blocks it still holds are never stored again, so no later block could
 *   be chained onto them. The rank is not fresh until the sync has run (each replay is bounded
 *   by `replayTimeoutMs`, whatever the ROUTER sends). What the buffer no longer holds (it
 *   wrapped) is lost: those blocks, and blocks stored under them later, are not indexed.
 * - **Catch-up**: a replay that does not end within its deadline (a ROUTER flooding stale
 *   frames, or silent) leaves the rank following the live stream from a cleared index, which
 *   under-claims and never over-claims. What the engine held before is asked for again in the
 *   background, 2 × `replayTimeoutMs` later and then ever less often: collected beside the live
 *   stream, which goes on being applied, and swapped in only once it ended. A ROUTER that keeps
 *   failing never clears the rank or holds its live messages again.
 */
import { applyPayload } from './apply-batch';
import type { CatchUp, RankStream, StreamContext } from './rank-stream';
import { readSeq, replayFrom, type ReplayedBatch } from './replay-client';

type ReplayOutcome = 'complete' | 'hole' | 'empty' | 'failed';
type RepairMode = 'gap' | 'sync';

/** The first catch-up after a replay that did not end, in `replayTimeoutMs`; each failed one doubles the wait, up to the last. */
const FIRST_CATCH_UP = 2;
const LAST_CATCH_UP = 64;

/** The bookkeeping for every rank of one subscription. */
export class KvSequencer {
  constructor(private readonly context: StreamContext) {}

  /** `stream`'s connection came up (the first time, or again). */
  connected(stream: RankStream): void {
    stream.connected = true;
    if (stream.replayEndpoint === null) {
      // What was missed while disconnected cannot be known: start over.
      if (stream.lastSeq !== null) this.context.sink.clearRank(stream.rank);
      stream.lastSeq = null;
      stream.synced = true;
    } else if (!stream.repairing) {
      this.startSync(stream, true, true);
    } else {
      // A replay under way is followed by a rebuild (the connection changed under it).
      stream.rebuild = true;
    }
    this.context.updateFresh(stream);
  }

  /** One live message, `[topic, seq, payload]`. */
  async live(stream: RankStream, frames: Buffer[]): Promise<void> {
    const seq = frames.length === 3 ? readSeq(frames[1]) : null;
    if (seq === null || seq < 0) {
      this.context.tell(stream, (listener) => listener.event?.(stream.rank, 'invalid', 1));
      return;
    }
    const payload = frames[2];
    if (stream.repairing) return this.hold(stream, seq, payload);
    if (stream.catchUp?.ready === true) {
      // Between two live messages: never under one being applied.
      this.swapIn(stream, stream.catchUp);
      return this.hold(stream, seq, payload);
    }
    if (!stream.synced || stream.rebuild) {
      // The message waits for the sync that rebuilds the rank (it is applied after the replay).
      this.hold(stream, seq, payload);
      if (this.startSync(stream, !stream.synced, !stream.synced)) return;
      stream.pending = [];
      stream.pendingBytes = 0;
    }
    if (stream.lastSeq === null) {
      // The first message (after a sync, or without a replay endpoint): followed from here.
    } else if (seq <= stream.lastSeq) {
      this.context.tell(stream, (listener) => listener.restart?.(stream.rank));
      this.lost(stream);
      this.hold(stream, seq, payload);
      if (this.startSync(stream, true, false)) return;
      stream.pending = [];
      stream.pendingBytes = 0;
    } else if (seq > stream.lastSeq + 1) {
      if (stream.replayEndpoint !== null) {
        this.hold(stream, seq, payload);
        void this.repair(stream, stream.lastSeq + 1, 'gap').catch((error: unknown) => this.context.report(stream, error));
        return;
      }
      this.context.tell(stream, (listener) => listener.gap?.(stream.rank, 'lost'));
      this.context.sink.clearRank(stream.rank);
    }
    if (stream.catchUpAt !== Infinity && stream.catchUp === null && Date.now() >= stream.catchUpAt) this.startCatchUp(stream);
    if (stream.catchUp !== null) this.record(stream, stream.catchUp, seq, payload);
    await applyPayload(this.context, stream, seq, payload);
  }

  /**
   * Clears the rank and rebuilds it from the engine's whole buffer. `force`: even within the
   * rate bound (one rebuild per 2 × `replayTimeoutMs`, so a rank that keeps losing messages is
   * held at most half the time); `untrusted`: the rank is not fresh until it has run (a new connection).
   */
  private startSync(stream: RankStream, force: boolean, untrusted: boolean): boolean {
    const now = Date.now();
    if (stream.replayEndpoint === null || (!force && now - stream.syncedAt < 2 * this.context.replayTimeoutMs)) return false;
    stream.syncedAt = now;
    stream.rebuild = false;
    this.context.sink.clearRank(stream.rank);
    stream.lastSeq = null;
    if (untrusted) stream.synced = false;
    this.context.updateFresh(stream);
    void this.repair(stream, 0, 'sync').catch((error: unknown) => this.context.report(stream, error));
    return true;
  }

  /** After a loss the index is cleared; the next message rebuilds it from the buffer (rate-bounded), else it follows from there. */
  private lost(stream: RankStream): void {
    this.context.sink.clearRank(stream.rank);
    stream.lastSeq = null;
    if (stream.replayEndpoint !== null) stream.rebuild = true;
  }

  private hold(stream: RankStream, seq: number, payload: Buffer): void {
    // Past the bound a message is dropped: the hole it leaves is found as a gap later.
    if (stream.pending.length < this.context.maxPending && stream.pendingBytes + payload.length <= this.context.maxPendingBytes) {
      stream.pending.push([seq, payload]);
      stream.pendingBytes += payload.length;
    }
  }

  /** `collected`: a catch-up's batches, applied instead of asking the ROUTER. */
  private async repair(stream: RankStream, from: number, mode: RepairMode, collected?: readonly ReplayedBatch[]): Promise<void> {
    const { context } = this;
    stream.repairing = true;
    // A replay of its own supersedes a catch-up under way (and would share its DEALER).
    this.dropCatchUp(stream, true);
    let outcome: ReplayOutcome;
    try {
      outcome = await this.replay(stream, from, mode, collected);
    } catch {
      outcome = 'failed';
    }
    if (context.closed()) return;
    let holed = outcome !== 'complete';
    // A replay that did not end would meet the same ROUTER at once: vLLM's answers a replay
    // whole between two publishes (vllm/distributed/kv_events.py, ZmqEventPublisher.
    // _publisher_thread and _service_replay), so one that floods or stays silent while the live
    // stream flows may well go on. The rank follows the live stream from a cleared index (it
    // under-claims what the engine held before, never over-claims), and catches up later
    // without being cleared or held for it.
    const failed = outcome === 'failed';
    // The index no longer follows the engine when a gap's replay brought nothing or live
    // messages were dropped meanwhile: it is rebuilt at the next message.
    let rebuild = mode === 'gap' && outcome === 'empty';
    if (failed || rebuild) context.sink.clearRank(stream.rank);
    // What a failed replay gave says nothing of the live sequence (a stale or forged number).
    if (failed) stream.lastSeq = null;
    // Live messages that came meanwhile (and keep coming while these are applied), in order;
    // what the replay already gave is skipped.
    while (stream.pending.length > 0 && !context.closed()) {
      const pending = stream.pending.sort((a, b) => a[0] - b[0]);
      stream.pending = [];
      stream.pendingBytes = 0;
      for (const [seq, payload] of pending) {
        if (stream.lastSeq !== null && seq <= stream.lastSeq) continue;
        if (stream.lastSeq !== null && seq !== stream.lastSeq + 1) {
          holed = true;
          rebuild ||= !failed;
          context.sink.clearRank(stream.rank);
        }
        await applyPayload(context, stream, seq, payload);
      }
    }
    stream.repairing = false;
    if (context.closed()) return;
    if (mode === 'gap') {
      const isLost = holed;
      context.tell(stream, (listener) => listener.gap?.(stream.rank, isLost ? 'lost' : 'replayed'));
    }
    stream.synced = true;
    // The blocks the engine still holds from before a loss are never stored again: without a
    // rebuild no later block could chain onto them (the rank would stop following its engine).
    if (rebuild) this.lost(stream);
    if (failed) this.behind(stream);
    else if (mode === 'sync') {
      stream.catchUpAt = Infinity;
      stream.catchUpDelay = 0;
    }
    context.updateFresh(stream);
  }

  /** The rank lacks what the engine held before a replay that did not end: a catch-up is due, each later than the last. */
  private behind(stream: RankStream): void {
    const delay = stream.catchUpDelay === 0 ? FIRST_CATCH_UP * this.context.replayTimeoutMs : stream.catchUpDelay;
    stream.catchUpAt = Date.now() + delay;
    stream.catchUpDelay = Math.min(2 * delay, LAST_CATCH_UP * this.context.replayTimeoutMs);
  }

  private startCatchUp(stream: RankStream): void {
    const catchUp: CatchUp = { batches: [], recorded: [], bytes: 0, ready: false };
    stream.catchUp = catchUp;
    stream.catchUpAt = Infinity;
    void this.collect(stream, catchUp).catch((error: unknown) => this.context.report(stream, error));
  }

  /** Collects the catch-up's replay within one deadline and the bounds on held messages; ready when it ended. */
  private async collect(stream: RankStream, catchUp: CatchUp): Promise<void> {
    const { context } = this;
    const dealer = (stream.dealer ??= context.dealer(stream));
    let ended = false;
    try {
      let over = false;
      for await (const batch of replayFrom(dealer, 0, Date.now() + context.replayTimeoutMs)) {
        if (stream.catchUp !== catchUp) return;
        catchUp.bytes += batch.payload.length;
        over = catchUp.batches.length >= context.maxPending || catchUp.bytes > context.maxPendingBytes;
        if (over) break;
        catchUp.batches.push(batch);
      }
      ended = !over;
    } catch {
      // Timed out, or its socket was closed under it.
    }
    if (stream.catchUp !== catchUp || context.closed()) return;
    if (ended && catchUp.batches.length > 0) catchUp.ready = true;
    // An empty buffer has nothing to give.
    else this.dropCatchUp(stream, !ended);
  }

  /** A live message applied while the catch-up is collected, kept to be applied again after it. */
  private record(stream: RankStream, catchUp: CatchUp, seq: number, payload: Buffer): void {
    catchUp.bytes += payload.length;
    if (catchUp.recorded.length < this.context.maxPending && catchUp.bytes <= this.context.maxPendingBytes) catchUp.recorded.push([seq, payload]);
    else this.dropCatchUp(stream, true);
  }

  /** Ends the catch-up under way, if any; `again`: another is due later. */
  private dropCatchUp(stream: RankStream, again: boolean): void {
    const catchUp = stream.catchUp;
    if (catchUp === null) return;
    stream.catchUp = null;
    // Its DEALER may still receive the answer: the next replay gets a fresh socket.
    if (!catchUp.ready) {
      stream.dealer?.close();
      stream.dealer = null;
    }
    if (again) this.behind(stream);
  }

  /** The catch-up ended: the rank is rebuilt from it, then from the live messages applied meanwhile (and those still coming). */
  private swapIn(stream: RankStream, catchUp: CatchUp): void {
    stream.catchUp = null;
    this.context.sink.clearRank(stream.rank);
    stream.lastSeq = null;
    stream.pending = catchUp.recorded;
    stream.pendingBytes = catchUp.recorded.reduce((sum, [, payload]) => sum + payload.length, 0);
    void this.repair(stream, 0, 'sync', catchUp.batches).catch((error: unknown) => this.context.report(stream, error));
  }

  /**
   * Applies replayed batches from `from` on. 'hole': the buffer no longer reached back to
   * `from`, or skipped a sequence inside (the rank was cleared at each hole); 'empty':
   * nothing came back; 'failed': the replay did not end within its deadline.
   */
  private async replay(stream: RankStream, from: number, mode: RepairMode, collected?: readonly ReplayedBatch[]): Promise<ReplayOutcome> {
    const { context } = this;
    const dealer = collected === undefined ? (stream.dealer ??= context.dealer(stream)) : null;
    try {
      let outcome: ReplayOutcome = 'empty';
      for await (const { seq, payload } of dealer === null ? collected! : replayFrom(dealer, from, Date.now() + context.replayTimeoutMs)) {
        if (context.closed()) return 'failed';
        if (outcome === 'empty') {
          outcome = seq <= from ? 'complete' : 'hole';
          if (outcome === 'hole' && mode === 'gap') context.sink.clearRank(stream.rank);
        }
        if (stream.lastSeq !== null && seq <= stream.lastSeq) continue;
        if (stream.lastSeq !== null && seq !== stream.lastSeq + 1) {
          // Every hole, not only the first: a later one hides removals as well.
          outcome = 'hole';
          context.sink.clearRank(stream.rank);
        }
        await applyPayload(context, stream, seq, payload);
      }
      return outcome;
    } catch (error) {
      // A timed-out DEALER may still receive the old answer later: the next replay gets a fresh socket.
      if (dealer !== null) {
        dealer.close();
        stream.dealer = null;
      }
      throw error;
    }
  }
}
