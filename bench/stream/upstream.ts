/**
 * `bench:stream`'s upstream: a node:http server standing in for vLLM's streamed chat
 * completions. A request with `"stream":true` gets `x-bench-chunks` chunks (default 100), one
 * every `x-bench-chunk-ms` (default 10), each a `chat.completion.chunk` as vLLM writes it plus
 * `"t"`, the time it was written (`performance.timeOrigin + performance.now()`, ms), then a
 * usage chunk (`stream_options.include_usage`) and `data: [DONE]`. Streams are written by one
 * ticker per chunk interval, not a timer each, so that 10,000 slow streams cost the upstream
 * little. A prefill leg (`"stream":false` with `kv_transfer_params`) gets NIXL's answer at once.
 * The shapes are vLLM's at 52a31cc: `chat.completion.chunk` (vllm/entrypoints/openai/chat_completion/
 * serving.py:413, protocol.py:141), the usage chunk of `stream_options.include_usage` (serving.py:494),
 * `kv_transfer_params` on a non-streamed answer (serving.py:1406).
 *
 * Run as a child: prints `READY <port>`.
 */
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

interface Stream {
  res: ServerResponse;
  left: number;
  chunks: number;
}

const HEAD = '{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"t":';
const PREFILL_ANSWER = JSON.stringify({
  id: 'chatcmpl-prefill',
  object: 'chat.completion',
  created: 1700000000,
  model: 'bench',
  choices: [{ index: 0, message: { role: 'assistant', content: 'x' }, finish_reason: 'length' }],
  usage: { prompt_tokens: 12, completion_tokens: 1, total_tokens: 13 },
  kv_transfer_params: { do_remote_prefill: true, do_remote_decode: false, remote_engine_id: 'bench-engine', remote_block_ids: [1, 2], remote_host: '127.0.0.1', remote_port: 5600, tp_size: 1 },
});

/** Streams by their chunk interval: one ticker per interval writes the next chunk of each. */
const tickers = new Map<number, Set<Stream>>();

function tick(interval: number): void {
  const streams = tickers.get(interval)!;
  const now = performance.timeOrigin + performance.now();
  const chunk = `data: ${HEAD}${now.toFixed(3)}}\n\n`;
  for (const stream of streams) {
    if (stream.res.destroyed) {
      streams.delete(stream);
      continue;
    }
    stream.res.write(chunk);
    if (--stream.left > 0) continue;
    streams.delete(stream);
    const usage = `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[],"usage":{"prompt_tokens":12,"total_tokens":${12 + stream.chunks},"completion_tokens":${stream.chunks}}}\n\n`;
    stream.res.end(`${usage}data: [DONE]\n\n`);
  }
  if (streams.size === 0) tickers.delete(interval);
  else setTimeout(tick, interval, interval);
}

const server = createServer((req, res) => {
  const body: Buffer[] = [];
  req.on('data', (chunk: Buffer) => body.push(chunk));
  req.on('end', () => {
    const text = Buffer.concat(body).toString();
    if (!text.includes('"stream":true')) {
      const answer = text.includes('kv_transfer_params') ? PREFILL_ANSWER : '{"id":"x","object":"chat.completion","choices":[]}';
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) });
      res.end(answer);
      return;
    }
    const chunks = Math.max(1, Number(req.headers['x-bench-chunks'] ?? 100) || 100);
    const interval = Math.max(1, Number(req.headers['x-bench-chunk-ms'] ?? 10) || 10);
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    let streams = tickers.get(interval);
    if (streams === undefined) {
      tickers.set(interval, (streams = new Set()));
      setTimeout(tick, interval, interval);
    }
    streams.add({ res, left: chunks, chunks });
  });
});
server.keepAliveTimeout = 60_000;
server.headersTimeout = 65_000;
server.maxConnections = Infinity;
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', 1024, () => {
  process.stdout.write(`READY ${(server.address() as AddressInfo).port}\n`);
});
process.on('SIGTERM', () => process.exit(0));
process.stdout.on('error', () => undefined);
