/**
 * One upstream's KV-event subscription: a ZeroMQ SUB socket per served rank, a DEALER per
 * rank for replays (sequence.ts keeps the sequence bookkeeping: gaps, replays, syncs).
 *
 * - A rank is **fresh** while its SUB is connected (zeromq's socket events; ZMTP heartbeats
 *   find a silent peer) and synced. An idle engine publishes nothing and stays fresh.
 * - A batch whose `data_parallel_rank` is not the connection's rank is refused and counted.
 * - Work is shared with request handling (cooperative.ts): the stream yields to I/O between
 *   messages, and within one past a work slice, while it decodes the payload as well as while
 *   it applies the events (apply-batch.ts). `maxMessageSize` is set on the socket, so an
 *   oversized frame is never received: libzmq drops the connection, and the socket is
 *   replaced (libzmq does not reconnect after that) and synced again.
 */
import type * as Zeromq from 'zeromq';
import { DEFAULT_KV_LIMITS } from './decode';
import type { KvEventSink } from '../index/exact-index';
import { resolveKvEndpoints } from './endpoints';
import type { MsgpackLimits } from './msgpack-reader';
import { loadZeromq } from '../optional-deps';
import { yieldToIo } from './cooperative';
import type { KvStreamListener, RankStream, StreamContext } from './rank-stream';
import { KvSequencer } from './sequence';

export type { KvEventType, KvGapOutcome, KvStreamListener } from './rank-stream';

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
  const context: StreamContext = {
    sink,
    limits,
    replayTimeoutMs,
    maxPending,
    maxPendingBytes,
    closed: () => closed,
    dealer(stream) {
      const dealer = new zmq.Dealer({ linger: 0, maxMessageSize: limits.maxBytes + 1024 });
      dealer.connect(stream.replayEndpoint as string);
      return dealer;
    },
    tell,
    report,
    updateFresh,
  };
  const sequencer = new KvSequencer(context);

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
    catchUpAt: Infinity,
    catchUpDelay: 0,
    catchUp: null,
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

  function tell(stream: RankStream, call: (to: KvStreamListener) => void): void {
    try {
      call(listener);
    } catch (error) {
      report(stream, error);
    }
  }

  function updateFresh(stream: RankStream): void {
    const fresh = stream.connected && stream.synced && !closed;
    if (fresh === stream.fresh) return;
    stream.fresh = fresh;
    tell(stream, (to) => to.fresh?.(stream.rank, fresh));
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
        await sequencer.live(stream, frames);
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
        if (event.type === 'handshake') sequencer.connected(stream);
        else if (event.type === 'disconnect') {
          onDisconnected(stream);
          return;
        }
      }
    } catch {
      // The observer ends with the socket.
    }
  }

  function onDisconnected(stream: RankStream): void {
    stream.connected = false;
    updateFresh(stream);
    tell(stream, (to) => to.disconnect?.(stream.rank));
    // libzmq does not reconnect a socket it dropped for an oversized frame: a new one does.
    const old = stream.sub;
    subscriber(stream);
    old.close();
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
