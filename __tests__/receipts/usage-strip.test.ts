/**
 * The usage chunk the router asks for, taken out of a stream: the client must get byte for byte
 * the stream vLLM would have sent it without `include_usage`, however the bytes are cut into
 * chunks. The streams here are written as vLLM 52a31cc writes them, from its code
 * (vllm/entrypoints/openai/chat_completion/serving.py:912-967 and completion/serving.py:397-462):
 * pydantic's compact JSON, fields in model order; `system_fingerprint` stamped on the events that
 * end a choice only without `include_usage`; with it, a final event with `"choices":[]`, the usage
 * (`prompt_tokens_details` only when tokens were cached) and the fingerprint (left out when it is
 * `None`: `exclude_none`); then `data: [DONE]`.
 */
import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { UsageStripper } from '../../lib/receipts/usage-strip';
import { askingUsage, mayAskUsage } from '../../lib/receipts/ask-usage';
import type { ReportedUsage } from '../../lib/receipts/usage-json';

interface StreamShape {
  kind: 'chat' | 'completions';
  /** Per choice: how many tokens it streams before the one that ends it. */
  lengths: number[];
  fingerprint: string | null;
  promptTokens: number;
  cachedTokens: number;
  /** An error event before the first token instead (vLLM's `except` branch): no choice ends, no usage. */
  error: boolean;
  content: string;
}

const ID = 'chatcmpl-3f0e2b6a9c6d4c1bb1f2f0b2a8d1e7c4';
const HEAD = (kind: StreamShape['kind']) => `{"id":"${ID}","object":"${kind === 'chat' ? 'chat.completion.chunk' : 'text_completion'}","created":1790000000,"model":"Qwen/Qwen3-8B"`;

/**
 * The stream vLLM sends for `shape`, with or without `stream_options.include_usage`; `forced`: from
 * a server started with `--enable-force-include-usage`, which sends usage whether asked or not,
 * on every event too (`should_include_usage` returns `(True, True)`, vllm/entrypoints/utils.py:281-285;
 * continuous usage at chat_completion/serving.py:546-551 and 932-938, completion/serving.py:426-432,
 * after `choices` in model order, chat_completion/protocol.py:144-145). `separator`: the blank line
 * that ends each event, as a proxy between may rewrite it.
 */
function vllmStream(shape: StreamShape, asked: boolean, forced = false, separator = '\n\n'): string {
  const includeUsage = asked || forced;
  const head = HEAD(shape.kind);
  let out = '';
  const event = (json: string) => (out += `data: ${json}${separator}`);
  const stamp = (ends: boolean) => (!includeUsage && ends && shape.fingerprint !== null ? `,"system_fingerprint":${JSON.stringify(shape.fingerprint)}` : '');
  const continuous = (completion: number) => (forced ? `,"usage":{"prompt_tokens":${shape.promptTokens},"total_tokens":${shape.promptTokens + completion},"completion_tokens":${completion}}` : '');
  if (shape.kind === 'chat') {
    shape.lengths.forEach((_, index) => event(`${head},"choices":[{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]${continuous(0)}}`));
  }
  const steps = Math.max(...shape.lengths) + 1;
  for (let step = 0; step < steps; step++) {
    if (shape.error && step === 0) {
      event('{"error":{"message":"engine died","type":"InternalServerError","param":null,"code":500}}');
      out += `data: [DONE]${separator}`;
      return out;
    }
    shape.lengths.forEach((length, index) => {
      if (step > length) return;
      const ends = step === length;
      const text = JSON.stringify(`${shape.content} ${step}`);
      const choice =
        shape.kind === 'chat'
          ? `{"index":${index},"delta":{"content":${text}},"logprobs":null,"finish_reason":${ends ? '"length","stop_reason":null' : 'null'}}`
          : `{"index":${index},"text":${text},"logprobs":null,"finish_reason":${ends ? '"length"' : 'null'},"stop_reason":null}`;
      event(`${head},"choices":[${choice}]${continuous(step + 1)}${stamp(ends)}}`);
    });
  }
  if (includeUsage) {
    const completion = shape.lengths.reduce((sum, length) => sum + length + 1, 0);
    const details = shape.cachedTokens > 0 ? `,"prompt_tokens_details":{"cached_tokens":${shape.cachedTokens}}` : '';
    const fingerprint = shape.fingerprint === null ? '' : `,"system_fingerprint":${JSON.stringify(shape.fingerprint)}`;
    event(`${head},"choices":[],"usage":{"prompt_tokens":${shape.promptTokens},"total_tokens":${shape.promptTokens + completion},"completion_tokens":${completion}${details}}${fingerprint}}`);
  }
  out += `data: [DONE]${separator}`;
  return out;
}

/** `bytes` cut at `cuts` (positions, any order) and fed through a stripper. */
function strip(bytes: Buffer, cuts: number[], forced: boolean[] = []): { out: Buffer; found: Array<ReportedUsage | undefined> } {
  const found: Array<ReportedUsage | undefined> = [];
  const stripper = new UsageStripper((usage, forces) => {
    found.push(usage);
    forced.push(forces);
  });
  const points = [...new Set(cuts.map((cut) => cut % (bytes.length + 1)))].sort((a, b) => a - b);
  const parts: Buffer[] = [];
  let from = 0;
  for (const point of [...points, bytes.length]) {
    parts.push(stripper.push(bytes.subarray(from, point)));
    from = point;
  }
  parts.push(stripper.end());
  return { out: Buffer.concat(parts), found };
}

const shapes = fc.record({
  kind: fc.constantFrom<'chat' | 'completions'>('chat', 'completions'),
  lengths: fc.array(fc.integer({ min: 0, max: 5 }), { minLength: 1, maxLength: 3 }),
  fingerprint: fc.option(fc.constantFrom('vllm-0.11.2-dp4-3a5f9c1e', 'custom "fp" \\ ünïcode'), { nil: null }),
  promptTokens: fc.integer({ min: 1, max: 5000 }),
  cachedTokens: fc.constantFrom(0, 16, 4096),
  error: fc.boolean(),
  // Content that looks like the markers, escaped as JSON escapes it.
  content: fc.constantFrom('plain', '"finish_reason":"stop"', '"choices":[],"usage":{', 'line\n\nbreak', 'data: [DONE]', '日本語'),
});

describe('UsageStripper', () => {
  it('gives the client the stream vLLM sends without include_usage, whatever the chunk boundaries', () => {
    fc.assert(
      fc.property(shapes, fc.array(fc.nat(), { maxLength: 12 }), (shape, cuts) => {
        const asked = Buffer.from(vllmStream(shape, true));
        const { out, found } = strip(asked, cuts);
        expect(out.toString()).toBe(vllmStream(shape, false));
        // Told once: the usage, or nothing when the stream had none.
        expect(found).toEqual([shape.error ? undefined : { promptTokens: shape.promptTokens, cachedTokens: shape.cachedTokens > 0 ? shape.cachedTokens : undefined }]);
      }),
      { numRuns: 500 },
    );
  });

  it('48.5: leaves the stream of a server that forces usage as it came (usage chunk, no fingerprint stamped), and says it forces', () => {
    fc.assert(
      fc.property(shapes, fc.array(fc.nat(), { maxLength: 12 }), (shape, cuts) => {
        // The router asked, but the server sends the same stream whether asked or not.
        const sent = vllmStream(shape, true, true);
        const forced: boolean[] = [];
        const { out, found } = strip(Buffer.from(sent), cuts, forced);
        expect(out.toString()).toBe(sent);
        expect(found).toEqual([shape.error ? undefined : { promptTokens: shape.promptTokens, cachedTokens: shape.cachedTokens > 0 ? shape.cachedTokens : undefined }]);
        // An error before the first token carries no usage to tell by, but for chat's role event before it.
        expect(forced).toEqual([!shape.error || shape.kind === 'chat']);
      }),
      { numRuns: 300 },
    );
  });

  it.each([
    ['CRLF', '\r\n\r\n'],
    ['CR', '\r\r'],
    ['LF then CRLF', '\n\r\n'],
  ])('48.7: ends events at a blank line of %s line ends too, whatever the chunk boundaries', (_name, separator) => {
    fc.assert(
      fc.property(shapes, fc.array(fc.nat(), { maxLength: 12 }), (shape, cuts) => {
        const { out, found } = strip(Buffer.from(vllmStream(shape, true, false, separator)), cuts);
        expect(out.toString()).toBe(vllmStream(shape, false, false, separator));
        expect(found).toEqual([shape.error ? undefined : { promptTokens: shape.promptTokens, cachedTokens: shape.cachedTokens > 0 ? shape.cachedTokens : undefined }]);
      }),
      { numRuns: 200 },
    );
  });

  it('48.7: passes CRLF events on as they come, not at the end of the stream', () => {
    const stripper = new UsageStripper(() => undefined);
    const first = Buffer.from(`data: ${HEAD('chat')},"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}\r\n\r\n`);
    expect(stripper.push(first).toString()).toBe(first.toString());
  });

  it('cut into single bytes, too', () => {
    const shape: StreamShape = { kind: 'chat', lengths: [3, 1], fingerprint: 'vllm-fp', promptTokens: 40, cachedTokens: 32, error: false, content: 'x' };
    const asked = Buffer.from(vllmStream(shape, true));
    expect(strip(asked, Array.from({ length: asked.length }, (_, at) => at)).out.toString()).toBe(vllmStream(shape, false));
  });

  it('passes on a stream that is not vLLM-framed untouched once an event grows past 1 MiB', () => {
    const found: Array<ReportedUsage | undefined> = [];
    const stripper = new UsageStripper((usage) => found.push(usage));
    const big = Buffer.alloc(1024 * 1024 + 10, 0x61);
    expect(stripper.push(big).equals(big)).toBe(true);
    expect(stripper.push(Buffer.from('data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n')).toString()).toBe('data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n');
    expect(found).toEqual([undefined]);
  });
});

describe('asking a stream for its usage', () => {
  it.each([
    [{ stream: true }, true],
    [{ stream: true, prompt: 'one prompt' }, true],
    [{ stream: true, prompt: [1, 2, 3] }, true],
    [{ stream: true, n: 1 }, true],
    [{ stream: false }, false],
    [{ stream: 'true' }, false],
    [{ stream: true, stream_options: null }, false],
    [{ stream: true, stream_options: { include_usage: false } }, false],
    [{ stream: true, n: 2 }, false],
    [{ stream: true, prompt: ['two', 'prompts'] }, false],
  ])('asks %j: %s (only a stream of one choice whose client said nothing)', (members, asks) => {
    expect(mayAskUsage(members)).toBe(asks);
  });

  it('puts the question first in the body, after any leading whitespace', () => {
    expect(askingUsage(Buffer.from(' \n{"stream":true}'))!.toString()).toBe(' \n{"stream_options":{"include_usage":true},"stream":true}');
    expect(JSON.parse(askingUsage(Buffer.from('{"model":"m","stream":true}'))!.toString())).toEqual({ stream_options: { include_usage: true }, model: 'm', stream: true });
    expect(askingUsage(Buffer.from('[1]'))).toBeUndefined();
  });

  it('lets everything go on unchanged once 64 KiB are held', () => {
    const found: Array<ReportedUsage | undefined> = [];
    const stripper = new UsageStripper((usage) => found.push(usage));
    const ends = Buffer.from('data: {"choices":[{"index":0,"finish_reason":"stop"}]}\n\n');
    const more = Buffer.from(`data: {"choices":[{"index":1,"delta":{"content":"${'x'.repeat(1000)}"}}]}\n\n`);
    expect(stripper.push(ends).length).toBe(0);
    const out: Buffer[] = [];
    for (let i = 0; i < 70; i++) out.push(stripper.push(more));
    expect(Buffer.concat(out).equals(Buffer.concat([ends, ...Array.from({ length: 70 }, () => more)]))).toBe(true);
    expect(found).toEqual([undefined]);
  });
});
