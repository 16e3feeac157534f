/**
 * A stand-in for vLLM's KV-event publisher (`ZmqEventPublisher` in
 * vllm/distributed/kv_events.py): a ZeroMQ PUB socket per rank sending
 * `[topic, seq (8 bytes, big-endian), payload]`, and an optional ROUTER per rank that answers
 * a replay request `[identity, empty, start seq]` with `[identity, empty, seq, payload]` for
 * every buffered batch from that sequence on, then `[identity, empty, −1, empty]`.
 *
 * Payloads are encoded as msgspec encodes vLLM's structs, byte for byte: the tests hold the
 * bytes vLLM 52a31cc's own publisher sent (fixtures/vllm-52a31cc) and check this encoder
 * reproduces them.
 */
import type * as Zeromq from 'zeromq';
import { loadZeromq } from '../../lib/exact-prefix/optional-deps';

/** An engine block hash as Python holds it: an int, or bytes (SHA-256 based hashes). */
export type PyBlockHash = number | bigint | Uint8Array;

export type MockKvEvent =
  | {
      type: 'BlockStored';
      blockHashes: PyBlockHash[];
      parentBlockHash: PyBlockHash | null;
      tokenIds: number[];
      blockSize: number;
      loraId?: number | null;
      medium?: string | null;
      loraName?: string | null;
      /** Per block: `[lora_name, …mm keys, cache_salt]`, or null for a block without extra keys. */
      extraKeys?: Array<Array<string | number> | null> | null;
      groupIdx?: number | null;
      /** `full_attention`, `sliding_window`, … (vLLM #40984). */
      kvCacheSpecKind?: string | null;
      kvCacheSpecSlidingWindow?: number | null;
    }
  | { type: 'BlockRemoved'; blockHashes: PyBlockHash[]; medium?: string | null; groupIdx?: number | null }
  | { type: 'AllBlocksCleared' };

/**
 * The layouts of KV-event payloads:
 * - 'current': vLLM's layout at 52a31cc (kv_events.py:25-109): the batch `[ts, events, rank]`,
 *   each event an array, its tag first: `BlockStored` with all 11 fields, `BlockRemoved` with
 *   `block_hashes, medium, group_idx`. msgspec writes every field of an `array_like` struct,
 *   defaults included (its `omit_defaults` applies to maps only);
 * - 'v0.9': BlockStored up to `lora_id`, BlockRemoved only `block_hashes`, no batch rank (vLLM
 *   before #18925);
 * - 'v0.10': as 'v0.9' with `medium` on both events and the rank when set;
 * - 'array-batch': the batch an array, each event a map tagged `type` whose fields equal to
 *   their default are left out: what newer vLLM writes (upstream main db92053, 2026-08:
 *   `KVCacheEvent` is no longer `array_like`, kv_events.py:36-41, since #42892; `KVEventBatch`
 *   still is, kv_events.py:25-33; fixtures/vllm-db92053/offload-cpu.json was recorded from it);
 *   a GPU store names its `kv_cache_spec_kind`, as there;
 * - 'map': the batch a map too. vLLM never wrote that (its batch has always been `array_like`);
 *   other producers may, and the router reads it.
 */
export type KvLayout = 'current' | 'v0.9' | 'v0.10' | 'array-batch' | 'map';

export interface MockKvBatch {
  ts: number;
  events: MockKvEvent[];
  dataParallelRank?: number | null;
}

/** `msgspec.msgpack.encode(batch)` for the given layout. */
export function encodeKvBatch(batch: MockKvBatch, layout: KvLayout): Buffer {
  const out = new Writer();
  const rank = batch.dataParallelRank ?? null;
  const arrayBatch = layout !== 'map';
  if (layout === 'current') {
    out.arrayHeader(3);
    out.float(batch.ts);
    encodeEvents(out, batch.events, layout);
    out.value(rank);
  } else if (arrayBatch) {
    out.arrayHeader(rank === null ? 2 : 3);
    out.float(batch.ts);
    encodeEvents(out, batch.events, layout);
    if (rank !== null) out.int(rank);
  } else {
    out.mapHeader(rank === null ? 2 : 3);
    out.str('ts');
    out.float(batch.ts);
    out.str('events');
    encodeEvents(out, batch.events, layout);
    if (rank !== null) {
      out.str('data_parallel_rank');
      out.int(rank);
    }
  }
  return out.finish();
}

function encodeEvents(out: Writer, events: MockKvEvent[], layout: KvLayout): void {
  out.arrayHeader(events.length);
  for (const event of events) {
    const fields = eventFields(event, layout);
    if (layout === 'current' || layout === 'v0.9' || layout === 'v0.10') {
      out.arrayHeader(fields.length + 1);
      out.str(event.type);
      for (const [, value] of fields) out.value(value);
    } else {
      out.mapHeader(fields.length + 1);
      out.str('type');
      out.str(event.type);
      for (const [name, value] of fields) {
        out.str(name);
        out.value(value);
      }
    }
  }
}

type Field = [string, unknown];

function eventFields(event: MockKvEvent, layout: KvLayout): Field[] {
  const legacy = layout === 'v0.9';
  const arrays = legacy || layout === 'v0.10';
  const current = layout === 'current';
  switch (event.type) {
    case 'BlockRemoved': {
      const fields: Field[] = [['block_hashes', event.blockHashes]];
      if (!legacy) fields.push(['medium', event.medium ?? null]);
      if (current) fields.push(['group_idx', event.groupIdx ?? null]);
      else if (!arrays && event.groupIdx != null) fields.push(['group_idx', event.groupIdx]);
      return fields;
    }
    case 'BlockStored': {
      const fields: Field[] = [
        ['block_hashes', event.blockHashes],
        ['parent_block_hash', event.parentBlockHash],
        ['token_ids', event.tokenIds],
        ['block_size', event.blockSize],
        ['lora_id', event.loraId ?? null],
      ];
      if (legacy) return fields;
      fields.push(['medium', event.medium ?? null]);
      if (arrays) return fields;
      fields.push(['lora_name', event.loraName ?? null]);
      if (current) {
        fields.push(
          ['extra_keys', event.extraKeys ?? null],
          ['group_idx', event.groupIdx ?? null],
          ['kv_cache_spec_kind', event.kvCacheSpecKind ?? null],
          ['kv_cache_spec_sliding_window', event.kvCacheSpecSlidingWindow ?? null],
        );
        return fields;
      }
      // A map leaves out fields with a None default while None (omit_defaults=True).
      if (event.extraKeys != null) fields.push(['extra_keys', event.extraKeys]);
      if (event.groupIdx != null) fields.push(['group_idx', event.groupIdx]);
      if (event.kvCacheSpecKind != null) fields.push(['kv_cache_spec_kind', event.kvCacheSpecKind]);
      if (event.kvCacheSpecSlidingWindow != null) fields.push(['kv_cache_spec_sliding_window', event.kvCacheSpecSlidingWindow]);
      return fields;
    }
    default:
      // AllBlocksCleared has no fields (and a test's unknown tag gets none either).
      return [];
  }
}

/** msgspec's MessagePack encoding rules: the smallest form of each int, floats as float64. */
class Writer {
  private buffer = Buffer.alloc(256);
  private length = 0;

  finish(): Buffer {
    return Buffer.from(this.buffer.subarray(0, this.length));
  }

  value(value: unknown): void {
    if (value === null || value === undefined) this.byte(0xc0);
    else if (typeof value === 'boolean') this.byte(value ? 0xc3 : 0xc2);
    else if (typeof value === 'number' || typeof value === 'bigint') this.int(value);
    else if (typeof value === 'string') this.str(value);
    else if (value instanceof Uint8Array) this.bin(value);
    else if (Array.isArray(value)) {
      this.arrayHeader(value.length);
      for (const item of value) this.value(item);
    } else throw new TypeError(`cannot encode ${typeof value}`);
  }

  int(input: number | bigint): void {
    const x = BigInt(input);
    if (x >= 0n) {
      if (x < 128n) this.byte(Number(x));
      else if (x < 0x100n) this.sized(0xcc, 1, x);
      else if (x < 0x10000n) this.sized(0xcd, 2, x);
      else if (x < 0x100000000n) this.sized(0xce, 4, x);
      else this.sized(0xcf, 8, x);
    } else if (x >= -32n) this.byte(Number(x) & 0xff);
    else if (x >= -0x80n) this.sized(0xd0, 1, x);
    else if (x >= -0x8000n) this.sized(0xd1, 2, x);
    else if (x >= -0x80000000n) this.sized(0xd2, 4, x);
    else this.sized(0xd3, 8, x);
  }

  float(x: number): void {
    this.reserve(9);
    this.buffer[this.length] = 0xcb;
    this.buffer.writeDoubleBE(x, this.length + 1);
    this.length += 9;
  }

  str(text: string): void {
    const bytes = Buffer.from(text, 'utf8');
    const n = bytes.length;
    if (n < 32) this.byte(0xa0 | n);
    else if (n < 0x100) this.sized(0xd9, 1, BigInt(n));
    else if (n < 0x10000) this.sized(0xda, 2, BigInt(n));
    else this.sized(0xdb, 4, BigInt(n));
    this.raw(bytes);
  }

  bin(bytes: Uint8Array): void {
    const n = bytes.length;
    if (n < 0x100) this.sized(0xc4, 1, BigInt(n));
    else if (n < 0x10000) this.sized(0xc5, 2, BigInt(n));
    else this.sized(0xc6, 4, BigInt(n));
    this.raw(bytes);
  }

  arrayHeader(n: number): void {
    if (n < 16) this.byte(0x90 | n);
    else if (n < 0x10000) this.sized(0xdc, 2, BigInt(n));
    else this.sized(0xdd, 4, BigInt(n));
  }

  mapHeader(n: number): void {
    if (n < 16) this.byte(0x80 | n);
    else if (n < 0x10000) this.sized(0xde, 2, BigInt(n));
    else this.sized(0xdf, 4, BigInt(n));
  }

  private sized(head: number, bytes: number, x: bigint): void {
    this.reserve(1 + bytes);
    this.buffer[this.length++] = head;
    const unsigned = BigInt.asUintN(bytes * 8, x);
    for (let i = bytes - 1; i >= 0; i--) this.buffer[this.length++] = Number((unsigned >> BigInt(i * 8)) & 0xffn);
  }

  private byte(b: number): void {
    this.reserve(1);
    this.buffer[this.length++] = b;
  }

  private raw(bytes: Uint8Array): void {
    this.reserve(bytes.length);
    this.buffer.set(bytes, this.length);
    this.length += bytes.length;
  }

  private reserve(n: number): void {
    if (this.length + n <= this.buffer.length) return;
    const next = Buffer.alloc(Math.max(this.buffer.length * 2, this.length + n));
    this.buffer.copy(next, 0, 0, this.length);
    this.buffer = next;
  }
}

export interface MockKvPublisherOptions {
  /** Global ranks to publish for. */
  ranks: readonly number[];
  /** Layout of the payloads. Default 'current'. */
  layout?: KvLayout;
  /** Default ''. */
  topic?: string;
  /**
   * 'ephemeral' (default): each rank binds a port of the OS's choice (read the endpoints back
   * from `endpoints`). Numbers: vLLM's scheme, rank r's PUB on base + r and its ROUTER on
   * replayBase + r; a base of 0 leaves that socket's ports to the OS.
   */
  ports?: 'ephemeral' | { base: number; replayBase: number };
  /** The address bound. Default '127.0.0.1'. */
  host?: string;
  /** Bind a replay ROUTER per rank. Default true. */
  replay?: boolean;
  /** Batches kept for replay per rank (vLLM's `buffer_steps`). Default 10,000. */
  bufferSteps?: number;
}

interface RankPublisher {
  rank: number;
  pub: Zeromq.Publisher;
  router: Zeromq.Router | null;
  seq: number;
  buffer: Array<[number, Buffer]>;
}

/** A running mock publisher. */
export interface MockKvPublisher {
  /** Each rank's PUB endpoint, in the order of `ranks`. */
  readonly endpoints: string[];
  /** Each rank's ROUTER endpoint (empty without replay). */
  readonly replayEndpoints: string[];
  /** Encodes and publishes one batch as `rank`'s engine would; resolves with its sequence. */
  publish(rank: number, events: MockKvEvent[], options?: { dataParallelRank?: number | null; drop?: boolean }): Promise<number>;
  /** Publishes `payload` as the next batch of `rank`, whatever its bytes (hostile-input tests). */
  publishPayload(rank: number, payload: Buffer): Promise<number>;
  /** Publishes raw frames on `rank`'s PUB socket (hostile-input tests). */
  publishRaw(rank: number, frames: Array<Buffer | string>): Promise<void>;
  /** The engine restarts: its sequence starts again at 0 and its replay buffer empties. */
  restart(rank: number): void;
  /** Forgets buffered batches below `seq` (a buffer that no longer reaches back). */
  trimReplay(rank: number, seq: number): void;
  close(): Promise<void>;
}

/** Binds every rank's sockets. */
export async function startMockKvPublisher(options: MockKvPublisherOptions): Promise<MockKvPublisher> {
  const zmq = loadZeromq();
  const layout = options.layout ?? 'current';
  const topic = options.topic ?? '';
  const bufferSteps = options.bufferSteps ?? 10_000;
  const ports = options.ports ?? 'ephemeral';
  const host = options.host ?? '127.0.0.1';
  const bindTo = (base: number | undefined, rank: number) => `tcp://${host}:${base ? base + rank : '*'}`;
  const ranks: RankPublisher[] = [];
  let closed = false;
  try {
    for (const rank of options.ranks) {
      const pub = new zmq.Publisher({ linger: 0 });
      ranks.push({ rank, pub, router: null, seq: 0, buffer: [] });
      await pub.bind(bindTo(ports === 'ephemeral' ? undefined : ports.base, rank));
      if (options.replay ?? true) {
        const router = new zmq.Router({ linger: 0 });
        ranks[ranks.length - 1].router = router;
        await router.bind(bindTo(ports === 'ephemeral' ? undefined : ports.replayBase, rank));
      }
    }
  } catch (error) {
    for (const one of ranks) {
      one.pub.close();
      one.router?.close();
    }
    throw error;
  }
  const loops = ranks.map((one) => (one.router === null ? Promise.resolve() : serveReplay(one, one.router)));

  async function serveReplay(one: RankPublisher, router: Zeromq.Router): Promise<void> {
    while (!closed) {
      let frames: Buffer[];
      try {
        frames = await router.receive();
      } catch {
        return;
      }
      // vLLM answers only [identity, empty, seq]; anything else is logged and dropped.
      if (frames.length !== 3) continue;
      const [identity, , start] = frames;
      const from = start.length === 8 ? start.readBigUInt64BE(0) : 0n;
      try {
        for (const [seq, payload] of one.buffer) {
          if (BigInt(seq) >= from) await router.send([identity, Buffer.alloc(0), seqBytes(seq), payload]);
        }
        await router.send([identity, Buffer.alloc(0), seqBytes(-1), Buffer.alloc(0)]);
      } catch {
        return;
      }
    }
  }

  async function send(one: RankPublisher, payload: Buffer, drop: boolean): Promise<number> {
    const seq = one.seq++;
    one.buffer.push([seq, payload]);
    if (one.buffer.length > bufferSteps) one.buffer.shift();
    // A dropped batch is what a subscriber misses past the PUB high-water mark.
    // A PUB never blocks (past its high-water mark it drops), so concurrent sends need no queue.
    if (!drop) await one.pub.send([topic, seqBytes(seq), payload]);
    return seq;
  }

  function find(rank: number): RankPublisher {
    const one = ranks.find((candidate) => candidate.rank === rank);
    if (one === undefined) throw new RangeError(`the mock publishes no rank ${rank}`);
    return one;
  }

  return {
    endpoints: ranks.map((one) => one.pub.lastEndpoint as string),
    replayEndpoints: ranks.flatMap((one) => (one.router === null ? [] : [one.router.lastEndpoint as string])),
    async publish(rank, events, publishOptions) {
      const reported = publishOptions?.dataParallelRank === undefined ? rank : publishOptions.dataParallelRank;
      const payload = encodeKvBatch({ ts: Date.now() / 1000, events, dataParallelRank: reported }, layout);
      return send(find(rank), payload, publishOptions?.drop ?? false);
    },
    async publishPayload(rank, payload) {
      return send(find(rank), payload, false);
    },
    async publishRaw(rank, frames) {
      await find(rank).pub.send(frames);
    },
    restart(rank) {
      const one = find(rank);
      one.seq = 0;
      one.buffer = [];
    },
    trimReplay(rank, seq) {
      const one = find(rank);
      one.buffer = one.buffer.filter(([kept]) => kept >= seq);
    },
    async close() {
      if (closed) return;
      closed = true;
      for (const one of ranks) {
        one.pub.close();
        one.router?.close();
      }
      await Promise.all(loops);
    },
  };
}

/** vLLM's sequence frame: `seq.to_bytes(8, "big")` (−1 signed for the replay's end). */
export function seqBytes(seq: number): Buffer {
  const bytes = Buffer.alloc(8);
  bytes.writeBigInt64BE(BigInt(seq));
  return bytes;
}
