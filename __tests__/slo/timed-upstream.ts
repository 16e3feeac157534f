import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A small timed upstream for the SLO tests: one server answering `/v1/completions` streams for
 * `ranks` data-parallel ranks (by the `x-data-parallel-rank` header), one SSE event per token as
 * vLLM streams them (`data: {…}\n\n`, then `data: [DONE]\n\n`). Its timing is the test's own:
 * rank r answers its first token after `ttftMs / speed[r]` and each next token after
 * `tokenMs × (1 + slowdown × (running − 1)) / speed[r]`, `running` being the streams it serves
 * at that moment; `slowFor(req)` names requests that stream `hostileFactor` times slower on
 * `hostileRank` (what a source would show the router if it could fake its own timings).
 */
export interface TimedUpstreamOptions {
  speeds: number[];
  ttftMs: number;
  tokenMs: number;
  slowdown?: number;
  slowFor?: (req: IncomingMessage) => boolean;
  hostileRank?: number;
  hostileFactor?: number;
}

export interface TimedUpstream {
  url: string;
  /** Requests served per rank. */
  served: number[];
  /** Every request's headers, as they arrived. */
  headers: IncomingHttpHeaders[];
  close(): Promise<void>;
}

export async function startTimedUpstream(options: TimedUpstreamOptions): Promise<TimedUpstream> {
  const { speeds, ttftMs, tokenMs, slowdown = 0 } = options;
  const running = speeds.map(() => 0);
  const served = speeds.map(() => 0);
  const headers: IncomingHttpHeaders[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      headers.push(req.headers);
      const rank = Number(req.headers['x-data-parallel-rank'] ?? 0);
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { max_tokens?: number };
      const tokens = body.max_tokens ?? 8;
      const hostile = options.slowFor?.(req) === true && rank === options.hostileRank ? (options.hostileFactor ?? 1) : 1;
      const speed = speeds[rank] ?? 1;
      served[rank]++;
      running[rank]++;
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
      let sent = 0;
      const next = () => {
        if (res.destroyed) return done();
        res.write(`data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"t${sent}","finish_reason":null}]}\n\n`);
        if (++sent === tokens) {
          res.end('data: [DONE]\n\n');
          return done();
        }
        setTimeout(next, (hostile * tokenMs * (1 + slowdown * (running[rank] - 1))) / speed);
      };
      let finished = false;
      const done = () => {
        if (!finished) running[rank]--;
        finished = true;
      };
      res.on('close', done);
      setTimeout(next, (hostile * ttftMs) / speed);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    served,
    headers,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** Streams one completion through `url` and reads it whole; the decision header (with `exposeDecision`) and the status. */
export async function streamCompletion(url: string, prompt: string, maxTokens: number, headers: Record<string, string> = {}): Promise<{ status: number; rank: number; decision: string; body: string }> {
  const answer = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'm', prompt, max_tokens: maxTokens, stream: true }),
  });
  const body = await answer.text();
  const decision = answer.headers.get('x-dp-router-decision') ?? '';
  const rank = Number(/rank=(\d+)/.exec(decision)?.[1] ?? -1);
  return { status: answer.status, rank, decision, body };
}
