/**
 * One upstream's KV-event subscription: a ZeroMQ SUB socket per served rank, a DEALER per
 * rank for replays, and the sequence bookkeeping that keeps the index honest.
 *
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
 * - A rank is **fresh** while its SUB is connected (zeromq's socket events; ZMTP heartbeats
 *   find a silent peer) and synced. An idle engine publishes nothing and stays fresh.
 * - A batch whose `data_parallel_rank` is not the connection's rank is refused and counted.
 * - Work is shared with request handling (cooperative.ts): the stream yields to I/O between
 *   messages, and within one past a work slice, while it decodes the payload as well as while
 *   it applies the events. `maxMessageSize` is set on the socket, so an
 *   oversized frame is never received: libzmq drops the connection, and the socket is
 *   replaced (libzmq does not reconnect after that) and synced again.
 */
import type * as Zeromq from 'zeromq';
import { DEFAULT_KV_LIMITS, decodeKvEventBatchCooperatively, type KvBlockStored, type KvEvent } from './decode';
import type { KvEventSink } from '../index/exact-index';
import { resolveKvEndpoints } from './endpoints';
import type { MsgpackLimits } from './msgpack-reader';
import { loadZeromq } from '../optional-deps';
import { WORK_SLICE, spend, spendDecoded, yieldToIo } from './cooperative';
import { readSeq, replayFrom } from './replay-client';

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
  /** A batch on `rank`'s connection named `reported` as its rank: refused. */
  rankMismatch?(rank: number, reported: number): void;
  /** `rank`'s sequence went backwards: its engine restarted, its index was cleared. */
  restart?(rank: number): void;
  /** `rank`'s connection dropped (the publisher went away, a heartbeat timed out, or a frame was past `maxMessageSize`). */
  disconnect?(rank: number): void;
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
  /** ZMTP heartbeat timeout: a connection silent this long (no data, no pong) is dropped. Default 6,000 ms (pings every third of it). */
  heartbeatTimeoutMs?: number;
  /** How long one replay may take in all before the gap counts as lost. Default 5,000 ms. */
  replayTimeoutMs?: number;
  /**
   * Live messages held while a replay runs, and their payload bytes; past either bound a
   * message is dropped and found as a gap after the replay. Default 10,000 and 64 MiB.
   */
  maxPendingMessages?: number;
  maxPendingBytes?: number;
  /** Payload bounds (see DEFAULT_KV_LIMITS); `maxBytes` is also the socket's `maxMessageSize`. */
  limits?: Partial<MsgpackLimits>;
}

/** A running subscription. */
export interface KvEventSubscriber {
  /** Whether `rank`'s stream is fresh: connected, and its index rebuilt since it (re)connected. */
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
  connected: boolean;
  /** False from a (re)connection until its first sync has run (whatever its outcome). */
  synced: boolean;
  /** The index was cleared after a loss: the next message rebuilds it from the buffer (the rank stays fresh: it under-claims meanwhile, never over-claims). */
  rebuild: boolean;
  lastSeq: number | null;
  repairing: boolean;
  pending: Array<[number, Buffer]>;
  pendingBytes: number;
  /** What `fresh` last reported. */
  fresh: boolean;
  /** When the last sync started (syncs after a loss are at most one per `replayTimeoutMs`). */
  syncedAt: number;
}

type ReplayOutcome = 'complete' | 'hole' | 'empty' | 'failed';
type RepairMode = 'gap' | 'sync';

// libzmq counts a multipart message's frames against the high-water mark; what waits in
// libzmq is outside the heap, so it is kept small: the loop drains it into `pending`.
const RECEIVE_HIGH_WATER_MARK = 64;

/** Connects to every served rank's publisher. Loads zeromq (an optional peer dependency). */
export function createKvEventSubscriber(options: KvSubscriberOptions): KvEventSubscriber {
  const path = `upstream '${options.upstream}' kvEvents`;
  const endpoints = resolveKvEndpoints(options.endpoint, options.ranks, `${path}.endpoint`);
  const replays = options.replayEndpoint === undefined ? null : resolveKvEndpoints(options.replayEndpoint, options.ranks, `${path}.replayEndpoint`);
  const zmq = loadZeromq();
  const topic = options.topic ?? '';
  const heartbeatTimeoutMs = options.heartbeatTimeoutMs ?? 6_000;
  const replayTimeoutMs = options.replayTimeoutMs ?? 5_000;
  const maxPending = options.maxPendingMessages ?? 10_000;
  const maxPendingBytes = options.maxPendingBytes ?? 64 * 1024 * 1024;
  const limits: MsgpackLimits = { ...DEFAULT_KV_LIMITS, ...options.limits };
  const { sink } = options;
  const listener = options.listener ?? {};
  let closed = false;

  /** A SUB for `stream`'s endpoint, watched from before it connects (events before the observer are not seen). */
  function subscriber(stream: RankStream): Zeromq.Subscriber {
    const sub = new zmq.Subscriber({
      linger: 0,
      // The frame carrying the payload is the largest; topic and sequence are small.
      maxMessageSize: limits.maxBytes + 1024,
      receiveHighWaterMark: RECEIVE_HIGH_WATER_MARK,
      heartbeatInterval: Math.max(1, Math.floor(heartbeatTimeoutMs / 3)),
      heartbeatTimeout: heartbeatTimeoutMs,
    });
    stream.sub = sub;
    void watch(stream, sub);
    sub.connect(stream.endpoint);
    sub.subscribe(topic);
    return sub;
  }

  const streams: RankStream[] = options.ranks.map((rank, at) => ({
    rank,
    endpoint: endpoints[at],
    replayEndpoint: replays?.[at] ?? null,
    sub: null as unknown as Zeromq.Subscriber,
    dealer: null,
    connected: false,
    synced: false,
    rebuild: false,
    lastSeq: null,
    repairing: false,
    pending: [],
    pendingBytes: 0,
    fresh: false,
    syncedAt: -Infinity,
  }));
  for (const stream of streams) subscriber(stream);
  const byRank = new Map(streams.map((stream) => [stream.rank, stream]));
  const loops = streams.map((stream) => receiveLoop(stream));

  function report(stream: RankStream, error: unknown): void {
    try {
      listener.error?.(stream.rank, error);
    } catch {
      // Nothing is left to tell.
    }
  }

  function tell(stream: RankStream, call: () => void): void {
    try {
      call();
    } catch (error) {
      report(stream, error);
    }
  }

  function updateFresh(stream: RankStream): void {
    const fresh = stream.connected && stream.synced && !closed;
    if (fresh === stream.fresh) return;
    stream.fresh = fresh;
    tell(stream, () => listener.fresh?.(stream.rank, fresh));
  }

  async function receiveLoop(stream: RankStream): Promise<void> {
    while (!closed) {
      const sub = stream.sub;
      let frames: Buffer[];
      try {
        frames = await sub.receive();
      } catch {
        // Closing the socket ends the wait: the subscription stopped, or the socket was replaced.
        if (closed) return;
        if (sub === stream.sub) await yieldToIo();
        continue;
      }
      try {
        await onLive(stream, frames);
      } catch (error) {
        report(stream, error);
      }
      // receive() hands over queued messages without returning to I/O.
      await yieldToIo();
    }
  }

  /** Follows the socket's connection: up (handshake done) or down. */
  async function watch(stream: RankStream, sub: Zeromq.Subscriber): Promise<void> {
    try {
      for await (const event of sub.events) {
        if (closed || sub !== stream.sub) return;
        if (event.type === 'handshake') onConnected(stream);
        else if (event.type === 'disconnect') {
          onDisconnected(stream);
          return;
        }
      }
    } catch {
      // The observer ends with the socket.
    }
  }

  function onConnected(stream: RankStream): void {
    stream.connected = true;
    if (stream.replayEndpoint === null) {
      // What was missed while disconnected cannot be known: start over.
      if (stream.lastSeq !== null) sink.clearRank(stream.rank);
      stream.lastSeq = null;
      stream.synced = true;
    } else if (!stream.repairing) {
      startSync(stream, true, true);
    } else {
      // A replay under way is followed by a rebuild (the connection changed under it).
      stream.rebuild = true;
    }
    updateFresh(stream);
  }

  function onDisconnected(stream: RankStream): void {
    stream.connected = false;
    updateFresh(stream);
    tell(stream, () => listener.disconnect?.(stream.rank));
    // libzmq does not reconnect a socket it dropped for an oversized frame: a new one does.
    const old = stream.sub;
    subscriber(stream);
    old.close();
  }

  /**
   * Clears the rank and rebuilds it from the engine's whole buffer. `force`: even within the
   * rate bound (one rebuild per `replayTimeoutMs`, so a ROUTER that never answers costs at
   * most half the time); `untrusted`: the rank is not fresh until it has run (a new connection).
   */
  function startSync(stream: RankStream, force: boolean, untrusted: boolean): boolean {
    const now = Date.now();
    if (stream.replayEndpoint === null || (!force && now - stream.syncedAt < 2 * replayTimeoutMs)) return false;
    stream.syncedAt = now;
    stream.rebuild = false;
    sink.clearRank(stream.rank);
    stream.lastSeq = null;
    if (untrusted) stream.synced = false;
    updateFresh(stream);
    void repair(stream, 0, 'sync').catch((error: unknown) => report(stream, error));
    return true;
  }

  /** After a loss the index is cleared; the next message rebuilds it from the buffer (rate-bounded), else it follows from there. */
  function lost(stream: RankStream): void {
    sink.clearRank(stream.rank);
    stream.lastSeq = null;
    if (stream.replayEndpoint !== null) stream.rebuild = true;
  }

  function hold(stream: RankStream, seq: number, payload: Buffer): void {
    // Past the bound a message is dropped: the hole it leaves is found as a gap later.
    if (stream.pending.length < maxPending && stream.pendingBytes + payload.length <= maxPendingBytes) {
      stream.pending.push([seq, payload]);
      stream.pendingBytes += payload.length;
    }
  }

  async function onLive(stream: RankStream, frames: Buffer[]): Promise<void> {
    const seq = frames.length === 3 ? readSeq(frames[1]) : null;
    if (seq === null || seq < 0) {
      tell(stream, () => listener.event?.(stream.rank, 'invalid', 1));
      return;
    }
    const payload = frames[2];
    if (stream.repairing) return hold(stream, seq, payload);
    if (!stream.synced || stream.rebuild) {
      // The message waits for the sync that rebuilds the rank (it is applied after the replay).
      hold(stream, seq, payload);
      if (startSync(stream, !stream.synced, !stream.synced)) return;
      stream.pending = [];
      stream.pendingBytes = 0;
    }
    if (stream.lastSeq === null) {
      // The first message (after a sync, or without a replay endpoint): followed from here.
    } else if (seq <= stream.lastSeq) {
      tell(stream, () => listener.restart?.(stream.rank));
      lost(stream);
      hold(stream, seq, payload);
      if (startSync(stream, true, false)) return;
      stream.pending = [];
      stream.pendingBytes = 0;
    } else if (seq > stream.lastSeq + 1) {
      if (stream.replayEndpoint !== null) {
        hold(stream, seq, payload);
        void repair(stream, stream.lastSeq + 1, 'gap').catch((error: unknown) => report(stream, error));
        return;
      }
      tell(stream, () => listener.gap?.(stream.rank, 'lost'));
      sink.clearRank(stream.rank);
    }
    await apply(stream, seq, payload);
  }

  async function apply(stream: RankStream, seq: number, payload: Uint8Array): Promise<void> {
    stream.lastSeq = seq;
    const decoded = await decodeKvEventBatchCooperatively(payload, limits, spendDecoded);
    if (closed) return;
    const rank = stream.rank;
    if (!decoded.ok) {
      // Whatever it held (a removal, say) is missed: the rank starts over.
      tell(stream, () => listener.event?.(rank, 'invalid', 1));
      sink.clearRank(rank);
      return;
    }
    const { batch } = decoded;
    if (batch.dataParallelRank !== null && batch.dataParallelRank !== rank) {
      const reported = batch.dataParallelRank;
      tell(stream, () => listener.rankMismatch?.(rank, reported));
      tell(stream, () => listener.event?.(rank, 'invalid', 1));
      return;
    }
    let stored = 0;
    let removed = 0;
    let cleared = 0;
    let invalid = batch.invalidEvents;
    for (const event of batch.events) {
      let ok = true;
      for (const part of slices(event)) {
        if (!sink.applyEvent(rank, part)) ok = false;
        const wait = spend(part.type === 'cleared' ? 1 : part.blockHashes.length + 1);
        if (wait !== undefined) await wait;
        if (closed) return;
      }
      if (!ok) invalid++;
      else if (event.type === 'stored') stored++;
      else if (event.type === 'removed') removed++;
      else cleared++;
    }
    if (stored > 0) tell(stream, () => listener.event?.(rank, 'stored', stored));
    if (removed > 0) tell(stream, () => listener.event?.(rank, 'removed', removed));
    if (cleared > 0) tell(stream, () => listener.event?.(rank, 'cleared', cleared));
    if (invalid > 0) tell(stream, () => listener.event?.(rank, 'invalid', invalid));
  }

  async function repair(stream: RankStream, from: number, mode: RepairMode): Promise<void> {
    stream.repairing = true;
    let outcome: ReplayOutcome;
    try {
      outcome = await replay(stream, from, mode);
    } catch {
      outcome = 'failed';
    }
    if (closed) return;
    let holed = outcome !== 'complete';
    // The index no longer follows the engine when the replay failed (or, for a gap, brought
    // nothing) or live messages were dropped meanwhile: it is rebuilt at the next message.
    let rebuild = outcome === 'failed' || (mode === 'gap' && outcome === 'empty');
    if (rebuild) sink.clearRank(stream.rank);
    // Live messages that came meanwhile (and keep coming while these are applied), in order;
    // what the replay already gave is skipped.
    while (stream.pending.length > 0 && !closed) {
      const pending = stream.pending.sort((a, b) => a[0] - b[0]);
      stream.pending = [];
      stream.pendingBytes = 0;
      for (const [seq, payload] of pending) {
        if (stream.lastSeq !== null && seq <= stream.lastSeq) continue;
        if (stream.lastSeq !== null && seq !== stream.lastSeq + 1) {
          holed = rebuild = true;
          sink.clearRank(stream.rank);
        }
        await apply(stream, seq, payload);
      }
    }
    stream.repairing = false;
    if (closed) return;
    if (mode === 'gap') {
      const isLost = holed;
      tell(stream, () => listener.gap?.(stream.rank, isLost ? 'lost' : 'replayed'));
    }
    stream.synced = true;
    // The blocks the engine still holds from before a loss are never stored again: without a
    // rebuild no later block could chain onto them (the rank would stop following its engine).
    if (rebuild) lost(stream);
    updateFresh(stream);
  }

  /**
   * Applies replayed batches from `from` on. 'hole': the buffer no longer reached back to
   * `from`, or skipped a sequence inside (the rank was cleared at each hole); 'empty':
   * nothing came back; 'failed': the replay did not end within its deadline.
   */
  async function replay(stream: RankStream, from: number, mode: RepairMode): Promise<ReplayOutcome> {
    if (stream.dealer === null) {
      stream.dealer = new zmq.Dealer({ linger: 0, maxMessageSize: limits.maxBytes + 1024 });
      stream.dealer.connect(stream.replayEndpoint as string);
    }
    const dealer = stream.dealer;
    try {
      let outcome: ReplayOutcome = 'empty';
      for await (const { seq, payload } of replayFrom(dealer, from, Date.now() + replayTimeoutMs)) {
        if (closed) return 'failed';
        if (outcome === 'empty') {
          outcome = seq <= from ? 'complete' : 'hole';
          if (outcome === 'hole' && mode === 'gap') sink.clearRank(stream.rank);
        }
        if (stream.lastSeq !== null && seq <= stream.lastSeq) continue;
        if (stream.lastSeq !== null && seq !== stream.lastSeq + 1) {
          // Every hole, not only the first: a later one hides removals as well.
          outcome = 'hole';
          sink.clearRank(stream.rank);
        }
        await apply(stream, seq, payload);
      }
      return outcome;
    } catch (error) {
      // A timed-out DEALER may still receive the old answer later: the next replay gets a fresh socket.
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
      for (const stream of streams) {
        stream.sub.close();
        stream.dealer?.close();
      }
      await Promise.all(loops);
    },
  };
}

/** A stored event cut into parts of at most WORK_SLICE blocks, each chained onto the last block of the one before, so one event can be applied between yields. */
function* slices(event: KvEvent): Generator<KvEvent> {
  if (event.type !== 'stored' || event.blockHashes.length <= WORK_SLICE) {
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
