import { describe, expect, it } from '@jest/globals';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { prefixAware } from '../../lib/policies/prefix-aware';
import type { Endpoint, Policy } from '../../lib/types';
import { closedAfterEach, serve, startGateway } from '../helpers';

/** How long the upstream holds a stream's first event after a keep-alive comment. */
const FIRST_EVENT_MS = 40;

/**
 * An upstream whose `/v1/completions` answers an event stream (a comment with the headers, the
 * first event `FIRST_EVENT_MS` later) when the body asks for `stream`, JSON otherwise, and a 503
 * stream for `/v1/fail`.
 */
function upstreamApp(req: IncomingMessage, res: ServerResponse): void {
  let body = '';
  req.on('data', (chunk: Buffer) => (body += chunk.toString()));
  req.on('end', () => {
    if (req.url === '/v1/fail') {
      res.writeHead(503, { 'content-type': 'text/event-stream' });
      res.end('data: {"error":"busy"}\n\n');
      return;
    }
    if (!(JSON.parse(body) as { stream?: boolean }).stream) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"choices":[]}');
      return;
    }
    res.writeHead(200, { 'content-type': 'Text/Event-Stream; charset=utf-8' });
    res.write(': ping\n\n');
    setTimeout(() => res.end('data: {"choices":[]}\n\ndata: [DONE]\n\n'), FIRST_EVENT_MS);
  });
}

type Totals = { firstTokens?: number; firstTokenSeconds?: number };

/** A policy that records what the first candidate's first-token totals were at each pick. */
function recordingPolicy(learnsFirstTokens: boolean): Policy & { seen: Totals[] } {
  const seen: Totals[] = [];
  return {
    name: 'recording',
    learnsFirstTokens,
    seen,
    pick(candidates: readonly Endpoint[]): Endpoint {
      const { firstTokens, firstTokenSeconds } = candidates[0] as Endpoint & Totals;
      seen.push({ firstTokens, firstTokenSeconds });
      return candidates[0];
    },
  };
}

describe('first-token totals fed to the policy (FirstTokenTotals)', () => {
  const started = closedAfterEach();

  async function gatewayWith(policy: Policy) {
    const upstream = await serve(upstreamApp);
    started.push(upstream);
    const gateway = await startGateway({ upstreams: [{ url: upstream.url, dataParallelSize: 1 }], policy });
    started.push(gateway);
    const send = async (path: string, stream: boolean) => {
      const response = await fetch(`${gateway.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', prompt: 'hello', stream }),
      });
      // The whole body read: the gateway has seen the first event before the client does.
      await response.text();
      return response.status;
    };
    return send;
  }

  it("counts each 2xx stream's first event, timed from dispatch, and nothing else", async () => {
    const policy = recordingPolicy(true);
    const send = await gatewayWith(policy);
    expect(await send('/v1/completions', true)).toBe(200);
    expect(await send('/v1/completions', false)).toBe(200);
    expect(await send('/v1/fail', true)).toBe(503);
    expect(await send('/v1/completions', true)).toBe(200);
    expect(await send('/v1/completions', true)).toBe(200);
    const counts = policy.seen.map((totals) => totals.firstTokens);
    // The JSON answer and the 503 stream count no first token.
    expect(counts).toEqual([0, 1, 1, 1, 2]);
    // Timed at the first event, not at the headers and their keep-alive comment.
    expect(policy.seen[4].firstTokenSeconds).toBeGreaterThanOrEqual((2 * (FIRST_EVENT_MS - 5)) / 1000);
  });

  it('keeps no totals for a policy that does not learn from them', async () => {
    const policy = recordingPolicy(false);
    const send = await gatewayWith(policy);
    await send('/v1/completions', true);
    await send('/v1/completions', true);
    expect(policy.seen.map((totals) => totals.firstTokens)).toEqual([0, 0]);
  });

  it('is asked for by prefix-aware', () => {
    expect(prefixAware().learnsFirstTokens).toBe(true);
  });
});
