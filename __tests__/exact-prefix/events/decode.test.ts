import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { Packr, Unpackr } from 'msgpackr';
import { DECODE_CHUNK, DEFAULT_KV_LIMITS, decodeKvEventBatch, decodeKvEventBatchCooperatively } from '../../../lib/exact-prefix/events/decode';
import { MsgpackReader } from '../../../lib/exact-prefix/events/msgpack-reader';
import { encodeKvBatch, type KvLayout, type MockKvBatch } from '../../../example-server/mock-vllm/kv-events';
import { fixture } from '../helpers';
import { RECORDINGS, decodedBatch, mockBatch, payloadOf, routerEvent, vllmRecording } from '../vllm-recordings';

const bytes0to31 = Buffer.from(Array.from({ length: 32 }, (_, i) => i));
const bytes32to63 = Buffer.from(Array.from({ length: 32 }, (_, i) => i + 32));

// Each fixture, the batch it encodes (as the mock's encoder takes it) and what the decoder gives.
const cases: Array<{ file: string; layout: KvLayout; batch: MockKvBatch; decoded: unknown }> = [
  {
    file: 'v0.9-array-int.hex',
    layout: 'v0.9',
    batch: {
      ts: 1.5,
      events: [
        { type: 'BlockStored', blockHashes: [-2, 0xfedcba9876543210n], parentBlockHash: null, tokenIds: [1, 300, 70000, 5], blockSize: 2 },
        { type: 'BlockRemoved', blockHashes: [-2] },
        { type: 'AllBlocksCleared' },
      ],
    },
    decoded: {
      ts: 1.5,
      dataParallelRank: null,
      invalidEvents: 0,
      events: [
        { type: 'stored', blockHashes: [-2, 0xfedcba9876543210n], parentBlockHash: null, tokenIds: [1, 300, 70000, 5], blockSize: 2, loraId: null, loraName: null, medium: null, extraKeyed: null, groupIdx: null, kvCacheSpecKind: null },
        { type: 'removed', blockHashes: [-2], medium: null, groupIdx: null },
        { type: 'cleared' },
      ],
    },
  },
  {
    file: 'v0.10-array-medium.hex',
    layout: 'v0.10',
    batch: {
      ts: 1.5,
      dataParallelRank: 5,
      events: [
        { type: 'BlockStored', blockHashes: [2n ** 63n], parentBlockHash: -(2n ** 63n), tokenIds: [7, 8], blockSize: 2, medium: 'GPU' },
        { type: 'BlockRemoved', blockHashes: [2n ** 63n], medium: 'CPU' },
      ],
    },
    decoded: {
      ts: 1.5,
      dataParallelRank: 5,
      invalidEvents: 0,
      events: [
        { type: 'stored', blockHashes: [2n ** 63n], parentBlockHash: -(2n ** 63n), tokenIds: [7, 8], blockSize: 2, loraId: null, loraName: null, medium: 'GPU', extraKeyed: null, groupIdx: null, kvCacheSpecKind: null },
        { type: 'removed', blockHashes: [2n ** 63n], medium: 'CPU', groupIdx: null },
      ],
    },
  },
  {
    file: 'map-bytes.hex',
    layout: 'map',
    batch: {
      ts: 1.5,
      dataParallelRank: 3,
      events: [
        { type: 'BlockStored', blockHashes: [bytes0to31], parentBlockHash: bytes32to63, tokenIds: [1, 2], blockSize: 2, medium: 'GPU' },
        { type: 'BlockRemoved', blockHashes: [bytes0to31], medium: 'GPU' },
        { type: 'AllBlocksCleared' },
      ],
    },
    decoded: {
      ts: 1.5,
      dataParallelRank: 3,
      invalidEvents: 0,
      events: [
        { type: 'stored', blockHashes: [bytes0to31.toString('latin1')], parentBlockHash: bytes32to63.toString('latin1'), tokenIds: [1, 2], blockSize: 2, loraId: null, loraName: null, medium: 'GPU', extraKeyed: null, groupIdx: null, kvCacheSpecKind: null },
        { type: 'removed', blockHashes: [bytes0to31.toString('latin1')], medium: 'GPU', groupIdx: null },
        { type: 'cleared' },
      ],
    },
  },
  {
    file: 'array-batch-map-events.hex',
    layout: 'array-batch',
    batch: {
      ts: 1.5,
      dataParallelRank: 0,
      events: [
        // As vLLM keys a LoRA request's blocks (#33304): the adapter's name first in every block, cache_salt on the first.
        { type: 'BlockStored', blockHashes: [10, 11], parentBlockHash: null, tokenIds: [1, 2], blockSize: 1, loraId: 7, loraName: 'sql-lora', extraKeys: [['sql-lora', 'salt'], ['sql-lora']], groupIdx: 0 },
      ],
    },
    decoded: {
      ts: 1.5,
      dataParallelRank: 0,
      invalidEvents: 0,
      events: [
        { type: 'stored', blockHashes: [10, 11], parentBlockHash: null, tokenIds: [1, 2], blockSize: 1, loraId: 7, loraName: 'sql-lora', medium: null, extraKeyed: [false, false], cacheSalt: 'salt', groupIdx: 0, kvCacheSpecKind: null },
      ],
    },
  },
];

// Every message vLLM 52a31cc's own publisher sent (fixtures/vllm-52a31cc: the inputs are in its README).
const recorded = RECORDINGS.flatMap((name) => vllmRecording(name).frames.map((_, at) => ({ name, at })));

describe('vLLM 52a31cc recordings', () => {
  it.each(recorded)('decodes $name message $at as vLLM itself reads it, no event invalid', ({ name, at }) => {
    const recording = vllmRecording(name);
    const vllm = decodedBatch(recording, at);
    expect(decodeKvEventBatch(payloadOf(recording, at))).toEqual({
      ok: true,
      batch: { ts: vllm.ts, dataParallelRank: vllm.data_parallel_rank, invalidEvents: 0, events: vllm.events.map(routerEvent) },
    });
  });

  it.each(recorded)("the mock's encoder writes $name message $at byte for byte", ({ name, at }) => {
    const recording = vllmRecording(name);
    expect(encodeKvBatch(mockBatch(decodedBatch(recording, at)), 'current').toString('hex')).toBe(recording.frames[at][2]);
  });

  it("reads a LoRA block whose only extra key is its adapter as keyed by token ids, and a salted one's salt as its first block's key", () => {
    const [lora, salted, saltedBase] = (decodeKvEventBatch(payloadOf(vllmRecording('lora'), 0)) as { ok: true; batch: { events: Array<{ extraKeyed: boolean[]; cacheSalt?: string }> } }).batch.events;
    // vLLM: [["sql-lora"], ["sql-lora"]], [["sql-lora", "tenant-a"], ["sql-lora"]], [["tenant-a"], null].
    expect([lora.extraKeyed, lora.cacheSalt]).toEqual([[false, false], undefined]);
    expect([salted.extraKeyed, salted.cacheSalt]).toEqual([[false, false], 'tenant-a']);
    expect([saltedBase.extraKeyed, saltedBase.cacheSalt]).toEqual([[false, false], 'tenant-a']);
  });
});

describe('decodeKvEventBatch', () => {
  it.each(cases)('decodes the $layout layout from its byte-exact fixture ($file)', ({ file, decoded }) => {
    expect(decodeKvEventBatch(fixture(file))).toEqual({ ok: true, batch: decoded });
  });

  it.each(cases)("the mock's $layout encoder writes the fixture's bytes exactly", ({ file, layout, batch }) => {
    expect(encodeKvBatch(batch, layout).toString('hex')).toBe(fixture(file).toString('hex'));
  });

  it('skips an event with an unknown tag or a wrong field and keeps the rest', () => {
    const payload = encodeKvBatch(
      {
        ts: 1,
        events: [
          { type: 'BlockStored', blockHashes: [1], parentBlockHash: null, tokenIds: [1, 2, 3], blockSize: 2 }, // 3 tokens for 1 block of 2
          { type: 'BlockStored', blockHashes: [1], parentBlockHash: null, tokenIds: [1, -1], blockSize: 2 }, // negative token
          { type: 'BlockRemoved', blockHashes: [] },
          { type: 'Unknown' } as never,
        ],
      },
      'map',
    );
    const result = decodeKvEventBatch(payload);
    expect(result).toEqual({ ok: true, batch: { ts: 1, dataParallelRank: null, invalidEvents: 3, events: [{ type: 'removed', blockHashes: [], medium: null, groupIdx: null }] } });
  });

  it.each([
    ['an empty payload', '', 'truncated'],
    ['a bare integer', '01', 'not_a_batch'],
    ['array32 of 2^32-1 elements in ten bytes', 'ddffffffff0000000000', 'too_long'],
    ['map32 of 2^32-1 entries in ten bytes', 'dfffffffff0000000000', 'too_long'],
    ['bin32 of 4 GiB in ten bytes', 'c6ffffffff0000000000', 'truncated'],
    ['str32 of 4 GiB in ten bytes', 'dbffffffff0000000000', 'truncated'],
    ['an array of 15 elements in three bytes', '9f0102', 'truncated'],
    ['a timestamp extension', 'd6ff00000000', 'unsupported_type'],
    ['the reserved byte 0xc1', 'c1', 'unsupported_type'],
    ['trailing bytes', '92cb3ff800000000000090c0', 'trailing_bytes'],
    ['a batch with ts as a string', '92a13190', 'not_a_batch'],
    ['a batch with a negative rank', '93cb3ff800000000000090ff', 'not_a_batch'],
    ['nesting deeper than the bound', '91'.repeat(40) + 'c0', 'too_deep'],
  ])('refuses %s', (_name, hex, reason) => {
    expect(decodeKvEventBatch(Buffer.from(hex, 'hex'))).toEqual({ ok: false, reason });
  });

  it('refuses a payload past maxBytes before reading it', () => {
    expect(decodeKvEventBatch(Buffer.alloc(101), { ...DEFAULT_KV_LIMITS, maxBytes: 100 })).toEqual({ ok: false, reason: 'too_large' });
  });

  // One engine step of a long-context server (`--max-num-batched-tokens` 300,000) storing 300k
  // tokens in blocks of 16, and evicting as many blocks, as vLLM 52a31cc writes it
  // (kv_events.py:49-96): about 430k values, past the earlier bound of 262,144.
  it('48.25: takes one engine step storing 300k tokens, and refuses past the bounds derived from the largest step', () => {
    const blocks = 300_000 / 16;
    const tokenIds = Array.from({ length: 300_000 }, (_, i) => (i * 7919) % 151_936);
    const hashes = Array.from({ length: blocks }, (_, i) => 2 ** 40 + i);
    const step: MockKvBatch = {
      ts: 1.5,
      dataParallelRank: 0,
      events: [
        { type: 'BlockStored', blockHashes: hashes, parentBlockHash: null, tokenIds, blockSize: 16, medium: 'GPU' },
        ...hashes.map((hash) => ({ type: 'BlockRemoved' as const, blockHashes: [hash + blocks], medium: 'GPU' })),
      ],
    };
    const payload = encodeKvBatch(step, 'current');
    const decoded = decodeKvEventBatch(payload);
    expect(decoded.ok).toBe(true);
    if (!decoded.ok) return;
    expect(decoded.batch.events).toHaveLength(1 + blocks);
    expect(decoded.batch.events[0]).toMatchObject({ type: 'stored', blockSize: 16 });
    expect((decoded.batch.events[0] as { tokenIds: number[] }).tokenIds).toEqual(tokenIds);
    // Five such steps in one payload: past the values bound, refused.
    const past = encodeKvBatch({ ...step, events: [...step.events, ...step.events, ...step.events, ...step.events, ...step.events] }, 'current');
    expect(decodeKvEventBatch(past)).toEqual({ ok: false, reason: 'too_many_values' });
  });

  it('refuses more values than maxValues', () => {
    const payload = Buffer.concat([Buffer.from('92cb3ff8000000000000dc0400', 'hex'), Buffer.alloc(1024, 0xc0)]);
    expect(decodeKvEventBatch(payload, { ...DEFAULT_KV_LIMITS, maxValues: 1000 })).toEqual({ ok: false, reason: 'too_many_values' });
  });

  it('never throws and stays within bounded memory on hostile bytes', () => {
    const before = process.memoryUsage().heapUsed;
    const valid = fixture('map-bytes.hex');
    fc.assert(
      fc.property(
        fc.oneof(
          fc.uint8Array({ maxLength: 256 }),
          // Valid payloads with bytes flipped, cut or spliced: close to what a decoder trusts.
          fc.tuple(fc.nat(valid.length - 1), fc.integer({ min: 0, max: 255 })).map(([at, b]) => {
            const copy = Buffer.from(valid);
            copy[at] = b;
            return copy;
          }),
          fc.nat(valid.length).map((cut) => valid.subarray(0, cut)),
          fc.tuple(fc.uint8Array({ maxLength: 16 }), fc.nat(valid.length)).map(([junk, at]) => Buffer.concat([valid.subarray(0, at), junk, valid.subarray(at)])),
        ),
        (payload) => {
          const result = decodeKvEventBatch(payload);
          expect(typeof result.ok).toBe('boolean');
        },
      ),
      { numRuns: 3000 },
    );
    // A loose bound: one unbounded allocation (a 2^32-element array) would be gigabytes.
    expect(process.memoryUsage().heapUsed - before).toBeLessThan(256 * 1024 * 1024);
  });

  it('decodes what msgpackr decodes, for any value msgspec could write (a differential check)', () => {
    const packr = new Packr({ useRecords: false, variableMapSize: true });
    const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'auto' as 'bigint' });
    const leaf = fc.oneof(
      fc.integer(),
      fc.bigInt({ min: -(2n ** 63n), max: 2n ** 64n - 1n }),
      fc.double({ noNaN: true }),
      fc.string({ unit: 'binary', maxLength: 40 }),
      fc.uint8Array({ maxLength: 24 }).map((bytes) => Buffer.from(bytes)),
      fc.constantFrom(null, true, false),
    );
    const value = fc.letrec((tie) => ({
      any: fc.oneof({ depthSize: 'small' }, leaf, tie('array'), tie('map')),
      array: fc.array(tie('any'), { maxLength: 12 }),
      map: fc.dictionary(fc.string({ maxLength: 8 }).filter((key) => key !== '__proto__'), tie('any'), { maxKeys: 8 }),
    })).any;
    fc.assert(
      fc.property(value, (input) => {
        const bytes = packr.pack(input);
        const reader = new MsgpackReader(bytes, { ...DEFAULT_KV_LIMITS, maxDepth: 64 });
        // A budget of 3 values a step: resuming is exercised at every kind of boundary.
        while (!reader.step(3));
        expect(reader.result()).toEqual({ ok: true, value: unpackr.unpack(bytes) });
      }),
      { numRuns: 100 },
    );
  });

  it('decodes a payload at the bounds in slices of at most 2 × DECODE_CHUNK values, with the same result (item 22.3)', async () => {
    const blocks = 60_000;
    const hashes = Array.from({ length: blocks }, (_, i) => 2 ** 40 + i);
    const payload = new Packr({ useRecords: false }).pack([1.5, [['BlockStored', hashes, null, hashes.map((h) => h % 100), 1, null, 'GPU']], 0]);
    const slices: number[] = [];
    const result = await decodeKvEventBatchCooperatively(payload, DEFAULT_KV_LIMITS, (values) => {
      slices.push(values);
      return undefined;
    });
    expect(result).toEqual(decodeKvEventBatch(payload));
    expect(result.ok).toBe(true);
    // ~240k values read, then 240k hashes and tokens checked: one pause point every chunk.
    expect(slices.length).toBeGreaterThanOrEqual((4 * blocks) / DECODE_CHUNK - 2);
    expect(Math.max(...slices)).toBeLessThanOrEqual(2 * DECODE_CHUNK);
  });
});
