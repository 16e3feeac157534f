/**
 * One upstream's KV-event subscription: a ZeroMQ SUB socket per served rank, a DEALER per
 * rank for replays, and the sequence bookkeeping that keeps the index honest.
 *
 * - Every message is `[topic, seq (8 bytes, big-endian), payload]`. The next expected
 *   sequence is the last one plus one; a jump forward is a gap, repaired by asking the
 *   rank's replay ROUTER for everything from the first missing sequence (`[empty, seq]`;
 *   the answers are `[empty, seq, payload]` each, then sequence −1 with an empty payload).
 *   Live messages that arrive meanwhile wait, in order. A gap the replay cannot close
 *   (no replay endpoint, timeout, or the engine's buffer no longer holds it) is `lost`: the
 *   rank's index is cleared, because a missed removal would otherwise claim blocks the
 *   engine no longer holds.
 * - A sequence at or below the last one means the engine restarted: the rank is cleared.
 * - The first message of a rank whose sequence is past 0 asks for a replay from 0 (not a
 *   gap): the engine's buffer (10,000 batches by default) seeds the index with blocks cached
 *   before the router connected.
 * - The batch's `data_parallel_rank` decides which rank its events belong to; a rank that
 *   disagrees with the connection's is counted, and one this upstream does not serve makes
 *   the batch invalid.
 * - A rank with no message for `staleAfterMs` is stale until its next message; a rank is
 *   stale until its first.
 */
import type * as Zeromq from 'zeromq';
import { DEFAULT_KV_LIMITS, decodeKvEventBatch } from './decode';
import type { KvEventSink } from '../index/exact-index';
import { resolveKvEndpoints } from './endpoints';
import type { MsgpackLimits } from './msgpack-scan';
import { loadZeromq } from '../optional-deps';

export type KvEventType = 'stored' | 'removed' | 'cleared' | 'invalid';
export type KvGapOutcome = 'replayed' | 'lost';

/**
 * Counts from the stream, for the caller to map to metrics: `event` to
 * `kv_events_total{type}`, `gap` to `kv_event_gaps_total{outcome}`, `fresh` to
 * `kv_stream_fresh`. Ranks passed are always ones this subscriber serves.
 */
export interface KvStreamListener {
  event?(rank: number, type: KvEventType, count: number): void;
  gap?(rank: number, outcome: KvGapOutcome): void;
  fresh?(rank: number, fresh: boolean): void;
  /** A batch on `rank`'s connection named `reported` as its rank. */
  rankMismatch?(rank: number, reported: number): void;
  /** `rank`'s sequence went backwards: its engine restarted, its index was cleared. */
  restart?(rank: number): void;
  /** A sink or listener call threw while handling `rank`'s stream; the stream goes on. */
  error?(rank: number, error: unknown): void;
}

export interface KvSubscriberOptions {
  /** The upstream's name, for error messages. */
  upstream: string;
  /** The global ranks served, in the order `endpoint` lists them when it is an array. */
  ranks: readonly number[];
  /** Rank 0's publisher (offset by the global rank), or one endpoint per served rank. */
  endpoint: string | readonly string[];
  /** Rank 0's replay ROUTER (offset like `endpoint`), or one per served rank; none: gaps are lost. */
  replayEndpoint?: string | readonly string[];
  /** The topic vLLM publishes under (`KVEventsConfig.topic`). Default ''. */
  topic?: string;
  sink: KvEventSink;
  listener?: KvStreamListener;
  /** A rank with no message for this long is stale. Default 30,000 ms. */
  staleAfterMs?: number;
  /** How long a replay may take before the gap counts as lost. Default 5,000 ms. */
  replayTimeoutMs?: number;
  /**
   * Live messages held while a replay runs, and their payload bytes; past either bound a
   * message is dropped and found as a gap after the replay. Default 10,000 and 64 MiB.
   */
  maxPendingMessages?: number;
  maxPendingBytes?: number;
  /** Payload bounds (see DEFAULT_KV_LIMITS). */
  limits?: Partial<MsgpackLimits>;
}

/** A running subscription. */
export interface KvEventSubscriber {
  /** Whether `rank`'s stream is fresh (a message within `staleAfterMs`). */
  isFresh(rank: number): boolean;
  /** Stops every socket and timer. */
  close(): Promise<void>;
}

interface RankStream {
  rank: number;
  endpoint: string;
  replayEndpoint: string | null;
  sub: Zeromq.Subscriber;
  dealer: Zeromq.Dealer | null;
  lastSeq: number | null;
  repairing: boolean;
  pending: Array<[number, Uint8Array]>;
  pendingBytes: number;
  lastMessageAt: number;
  fresh: boolean;
}

const END_SEQ = -1;

type ReplayOutcome = 'complete' | 'hole' | 'empty' | 'failed';

/** Connects to every served rank's publisher. Loads zeromq (an optional peer dependency). */
export function createKvEventSubscriber(options: KvSubscriberOptions): KvEventSubscriber {
  const path = `upstream '${options.upstream}' kvEvents`;
  const endpoints = resolveKvEndpoints(options.endpoint, options.ranks, `${path}.endpoint`);
  const replays = options.replayEndpoint === undefined ? null : resolveKvEndpoints(options.replayEndpoint, options.ranks, `${path}.replayEndpoint`);
  const zmq = loadZeromq();
  const topic = options.topic ?? '';
  const staleAfterMs = options.staleAfterMs ?? 30_000;
  const replayTimeoutMs = options.replayTimeoutMs ?? 5_000;
  const maxPending = options.maxPendingMessages ?? 10_000;
  const maxPendingBytes = options.maxPendingBytes ?? 64 * 1024 * 1024;
  const limits: MsgpackLimits = { ...DEFAULT_KV_LIMITS, ...options.limits };
  const { sink } = options;
  const listener = options.listener ?? {};
  const served = new Set(options.ranks);
  let closed = false;

  const streams: RankStream[] = options.ranks.map((rank, at) => {
    // Not maxMessageSize: past it libzmq drops the connection and, in our tests, the SUB
    // never received again. An oversized payload is refused by the decoder instead.
    const sub = new zmq.Subscriber({ linger: 0 });
    sub.connect(endpoints[at]);
    sub.subscribe(topic);
    return { rank, endpoint: endpoints[at], replayEndpoint: replays?.[at] ?? null, sub, dealer: null, lastSeq: null, repairing: false, pending: [], pendingBytes: 0, lastMessageAt: 0, fresh: false };
  });
  const byRank = new Map(streams.map((stream) => [stream.rank, stream]));
  const loops = streams.map((stream) => receiveLoop(stream));

  const timer = setInterval(() => {
    const now = Date.now();
    for (const stream of streams) {
      if (stream.fresh && now - stream.lastMessageAt > staleAfterMs) {
        stream.fresh = false;
        listener.fresh?.(stream.rank, false);
      }
    }
  }, Math.max(10, Math.floor(staleAfterMs / 4)));
  timer.unref();

  async function receiveLoop(stream: RankStream): Promise<void> {
    while (!closed) {
      let frames: Buffer[];
      try {
        frames = await stream.sub.receive();
      } catch {
        // Closing the socket ends the wait; nothing else rejects a SUB receive.
        return;
      }
      guarded(stream, () => onLive(stream, frames));
    }
  }

  // The sink and listener are the caller's code: a throw there must not end the stream, nor
  // surface as an unhandled rejection from a receive loop.
  function guarded(stream: RankStream, work: () => void): void {
    try {
      work();
    } catch (error) {
      report(stream, error);
    }
  }

  function report(stream: RankStream, error: unknown): void {
    try {
      listener.error?.(stream.rank, error);
    } catch {
      // Nothing is left to tell.
    }
  }

  function onLive(stream: RankStream, frames: Buffer[]): void {
    const seq = frames.length === 3 ? readSeq(frames[1]) : null;
    if (seq === null || seq < 0) {
      listener.event?.(stream.rank, 'invalid', 1);
      return;
    }
    if (stream.repairing) {
      // Past the bound a message is dropped: the hole it leaves is found as a gap later.
      if (stream.pending.length < maxPending && stream.pendingBytes + frames[2].length <= maxPendingBytes) {
        stream.pending.push([seq, frames[2]]);
        stream.pendingBytes += frames[2].length;
      }
      return;
    }
    if (stream.lastSeq === null) {
      if (seq > 0 && stream.replayEndpoint !== null) {
        stream.pending.push([seq, frames[2]]);
        void repair(stream, 0, false).catch((error: unknown) => report(stream, error));
        return;
      }
    } else if (seq <= stream.lastSeq) {
      sink.clearRank(stream.rank);
      listener.restart?.(stream.rank);
    } else if (seq > stream.lastSeq + 1) {
      if (stream.replayEndpoint !== null) {
        stream.pending.push([seq, frames[2]]);
        void repair(stream, stream.lastSeq + 1, true).catch((error: unknown) => report(stream, error));
        return;
      }
      listener.gap?.(stream.rank, 'lost');
      sink.clearRank(stream.rank);
    }
    apply(stream, seq, frames[2]);
  }

  function apply(stream: RankStream, seq: number, payload: Uint8Array): void {
    stream.lastSeq = seq;
    const decoded = decodeKvEventBatch(payload, limits);
    if (!decoded.ok) {
      listener.event?.(stream.rank, 'invalid', 1);
      return;
    }
    stream.lastMessageAt = Date.now();
    if (!stream.fresh) {
      stream.fresh = true;
      listener.fresh?.(stream.rank, true);
    }
    const { batch } = decoded;
    let rank = stream.rank;
    if (batch.dataParallelRank !== null && batch.dataParallelRank !== rank) {
      if (!served.has(batch.dataParallelRank)) {
        listener.event?.(stream.rank, 'invalid', 1);
        return;
      }
      listener.rankMismatch?.(stream.rank, batch.dataParallelRank);
      rank = batch.dataParallelRank;
    }
    let stored = 0;
    let removed = 0;
    let cleared = 0;
    let invalid = batch.invalidEvents;
    for (const event of batch.events) {
      if (!sink.applyEvent(rank, event)) invalid++;
      else if (event.type === 'stored') stored++;
      else if (event.type === 'removed') removed++;
      else cleared++;
    }
    if (stored > 0) listener.event?.(rank, 'stored', stored);
    if (removed > 0) listener.event?.(rank, 'removed', removed);
    if (cleared > 0) listener.event?.(rank, 'cleared', cleared);
    if (invalid > 0) listener.event?.(rank, 'invalid', invalid);
  }

  async function repair(stream: RankStream, from: number, isGap: boolean): Promise<void> {
    stream.repairing = true;
    let outcome: ReplayOutcome;
    try {
      outcome = await replay(stream, from, isGap);
    } catch {
      outcome = 'failed';
    }
    if (closed) return;
    const pending = stream.pending.sort((a, b) => a[0] - b[0]);
    stream.pending = [];
    stream.pendingBytes = 0;
    stream.repairing = false;
    let lost = isGap && outcome !== 'complete';
    // A hole inside the replay was cleared where it was found.
    if (isGap && (outcome === 'failed' || outcome === 'empty')) sink.clearRank(stream.rank);
    // Live messages that came meanwhile, in order; what the replay already gave is skipped.
    for (const [seq, payload] of pending) {
      if (stream.lastSeq !== null && seq <= stream.lastSeq) continue;
      if (stream.lastSeq !== null && seq !== stream.lastSeq + 1 && !lost) {
        lost = true;
        sink.clearRank(stream.rank);
      }
      apply(stream, seq, payload);
    }
    // A lost gap clears the rank before what follows it is applied: events on either side
    // of the hole may be stale (a missed removal), so the index starts over from there.
    if (isGap || lost) listener.gap?.(stream.rank, lost ? 'lost' : 'replayed');
  }

  /**
   * Applies replayed batches from `from` on. 'hole': the engine's buffer no longer reached
   * back to `from` (for a gap, the rank was cleared before the first batch was applied);
   * 'empty': nothing came back.
   */
  async function replay(stream: RankStream, from: number, isGap: boolean): Promise<ReplayOutcome> {
    if (stream.dealer === null) {
      stream.dealer = new zmq.Dealer({ linger: 0, receiveTimeout: replayTimeoutMs });
      stream.dealer.connect(stream.replayEndpoint as string);
    }
    const dealer = stream.dealer;
    const request = Buffer.alloc(8);
    request.writeBigInt64BE(BigInt(from));
    try {
      await dealer.send([Buffer.alloc(0), request]);
      let outcome: ReplayOutcome = 'empty';
      let first = true;
      for (;;) {
        const frames = await dealer.receive();
        const seq = frames.length === 3 ? readSeq(frames[1]) : null;
        if (seq === null) continue;
        if (seq === END_SEQ) return outcome;
        if (first) {
          first = false;
          outcome = seq <= from ? 'complete' : 'hole';
          if (outcome === 'hole' && isGap) sink.clearRank(stream.rank);
        }
        if (stream.lastSeq !== null && seq <= stream.lastSeq) continue;
        if (stream.lastSeq !== null && seq !== stream.lastSeq + 1 && outcome === 'complete') {
          outcome = 'hole';
          if (isGap) sink.clearRank(stream.rank);
        }
        apply(stream, seq, frames[2]);
      }
    } catch (error) {
      // A timed-out DEALER may still receive the old answer later: start the next replay
      // on a fresh socket.
      dealer.close();
      stream.dealer = null;
      throw error;
    }
  }

  return {
    isFresh(rank) {
      return byRank.get(rank)?.fresh ?? false;
    },
    async close() {
      if (closed) return;
      closed = true;
      clearInterval(timer);
      for (const stream of streams) {
        stream.sub.close();
        stream.dealer?.close();
      }
      await Promise.all(loops);
    },
  };
}

/** The sequence number frame: a big-endian int64 (−1 ends a replay); null when malformed. */
function readSeq(frame: Buffer): number | null {
  if (frame.length !== 8) return null;
  const value = frame.readBigInt64BE(0);
  if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < -1n) return null;
  return Number(value);
}
