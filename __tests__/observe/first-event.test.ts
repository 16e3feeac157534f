import { describe, expect, it } from '@jest/globals';
import { IncomingMessage } from 'node:http';
import { PassThrough, Readable } from 'node:stream';
import { startMockVllm } from '../../example-server/mock-vllm';
import { onFirstEvent } from '../../lib/observe/first-event';
import { startGateway } from '../helpers';

/**
 * Feeds `chunks` through a real stream, one per turn of the event loop, and says which chunk (by
 * index) held the first event's first byte, from the time `onFirstEvent` reports.
 */
async function firstEventChunk(chunks: Array<string | Buffer>): Promise<number | undefined> {
  const stream = new PassThrough();
  const written: number[] = [];
  const found: number[] = [];
  onFirstEvent(stream, (at) => found.push(at));
  for (const chunk of chunks) {
    written.push(performance.now());
    stream.write(typeof chunk === 'string' ? Buffer.from(chunk) : chunk);
    await new Promise((resolve) => setImmediate(resolve));
  }
  stream.end();
  expect(found.length).toBeLessThanOrEqual(1);
  if (found.length === 0) return undefined;
  return written.filter((time) => time <= found[0]).length - 1;
}

describe('onFirstEvent', () => {
  it.each([
    ['a data line', ['data: x\n\n'], 0],
    ['each field', ['event: a\n'], 0],
    ['an id field', [': c\n', 'id: 1\n'], 1],
    ['a retry field', ['\n\n', 'retry: 10\n'], 1],
    ['a comment first', [': ping\n\n', 'data: x\n\n'], 1],
    ['a comment split over chunks', [': pi', 'ng\n', '\ndata: x\n\n'], 2],
    ['a field name split over chunks', [': ping\n\nda', 'ta: x\n\n'], 0],
    ['a field name split after one byte', ['\n', 'd', 'ata:', ' x\n'], 1],
    ['CR line ends', [':a\r\r', 'data:x\r\r'], 1],
    ['CRLF line ends', [':a\r\n\r\n', 'data:x\r\n'], 1],
    ['a byte-order mark', ['\ufeff', ': hi\n', 'data: x\n'], 2],
    ['a line that only looks like a field', ['database: x\n', 'data: y\n'], 1],
    ['a field name with no colon yet', ['data', ' x\n', 'data: y\n'], 2],
    ['unknown fields', ['foo: x\n', 'date: x\n', 'ids: 1\n', 'data: y\n'], 3],
    ['no event at all', [': ping\n\n', '\n'], undefined],
    ['an empty stream', [], undefined],
  ])('%s', async (_case, chunks, expected) => {
    expect(await firstEventChunk(chunks)).toBe(expected);
  });

  it('reads a byte-order mark split between chunks, byte by byte', async () => {
    const chunks = [Buffer.from([0xef]), Buffer.from([0xbb]), Buffer.from([0xbf]), ': c\n', 'data: x\n'];
    expect(await firstEventChunk(chunks)).toBe(4);
  });

  it('skips a line that starts with half a byte-order mark', async () => {
    expect(await firstEventChunk([Buffer.from([0xef, 0xbb]), 'data: x\n', 'data: y\n'])).toBe(2);
  });
});

describe('a streamed answer through dpRouter', () => {
  it('gets one first-token scan beside the relay, for the metrics and a policy that learns first tokens alike, and none after the first event', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 30 });
    const gateway = await startGateway({ upstreams: [{ url: mock.url, dataParallelSize: 2 }], policy: 'prefix-aware' });
    // Every 'data' listener put on an upstream's event-stream answer in this process (the gateway's).
    const answers = new Map<IncomingMessage, number>();
    const on = Readable.prototype.on;
    const spy = function (this: Readable, event: string | symbol, listener: (...args: unknown[]) => void) {
      if (event === 'data' && this instanceof IncomingMessage && String(this.headers['content-type']).startsWith('text/event-stream')) answers.set(this, (answers.get(this) ?? 0) + 1);
      return on.call(this, event, listener);
    };
    Readable.prototype.on = spy as typeof on;
    try {
      const response = await fetch(`${gateway.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock-model', prompt: 'count the listeners', max_tokens: 6, stream: true }),
      });
      const reader = response.body!.getReader();
      await reader.read();
      await reader.read();
      const [[answer, added]] = [...answers];
      // The relay's pipe, one scan, which left at the first event, and the rank header's check
      // (rankHeader 'local' sends one), a once listener that looks at the first chunk for vLLM's
      // out-of-range error event (lib/upstreams/rank-rejection.ts).
      expect(added).toBe(3);
      expect(answer.listenerCount('data')).toBe(1);
      while (!(await reader.read()).done);
      // The metric got its first token from that scan.
      const counts = [...(await gateway.registry.metrics()).matchAll(/^dp_router_time_to_first_token_seconds_count\{[^}]*\} (\d+)$/gm)].map((match) => Number(match[1]));
      expect(counts.reduce((sum, count) => sum + count, 0)).toBe(1);
    } finally {
      Readable.prototype.on = on;
      await gateway.close();
      await mock.close();
    }
  });
});
