/**
 * One rank's KV-event stream as the subscriber's parts share it: the listener the counts go
 * to, the per-rank state, and the hooks through which the sequence bookkeeping (sequence.ts)
 * and the batch applier (apply-batch.ts) reach the subscriber that owns the sockets.
 */
import type * as Zeromq from 'zeromq';
import type { KvEventSink } from '../index/exact-index';
import type { MsgpackLimits } from './msgpack-reader';
import type { ReplayedBatch } from './replay-client';

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

/** The state of one served rank's stream. */
export interface RankStream {
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
  /**
   * After a replay that did not end, the rank follows the live stream without what the engine
   * held before: when a catch-up replay is next due (ms, `Date.now()`); `Infinity` when none is.
   */
  catchUpAt: number;
  /** How long after the next failed catch-up the one after it is due (0: the first wait). */
  catchUpDelay: number;
  /** The catch-up replay being collected; `null` when none is. */
  catchUp: CatchUp | null;
}

/**
 * A catch-up replay from sequence 0, collected beside the live stream (which goes on being
 * applied) and swapped in whole once it ended; one that does not end leaves the index as it was.
 */
export interface CatchUp {
  readonly batches: ReplayedBatch[];
  /** The live messages applied while it is collected: applied again after its batches. */
  readonly recorded: Array<[number, Buffer]>;
  /** Payload bytes of both, bounded by `maxPendingBytes`. */
  bytes: number;
  /** It ended: the next live message swaps it in. */
  ready: boolean;
}

/** What the sequence bookkeeping and the applier need from the subscriber. */
export interface StreamContext {
  readonly sink: KvEventSink;
  readonly limits: Readonly<MsgpackLimits>;
  /** How long one replay may take in all. */
  readonly replayTimeoutMs: number;
  /** Bounds on the live messages held while a replay runs. */
  readonly maxPending: number;
  readonly maxPendingBytes: number;
  /** Whether the subscription was closed. */
  closed(): boolean;
  /** A new DEALER connected to `stream`'s replay endpoint. */
  dealer(stream: RankStream): Zeromq.Dealer;
  /** Calls the listener; what it throws goes to `listener.error`. */
  tell(stream: RankStream, call: (listener: KvStreamListener) => void): void;
  /** Reports an error thrown while handling `stream`. */
  report(stream: RankStream, error: unknown): void;
  /** Reports `stream`'s freshness when it changed. */
  updateFresh(stream: RankStream): void;
}
