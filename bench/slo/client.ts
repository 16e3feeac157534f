/**
 * The client of `bench:slo`: sends each planned request at its time (open loop) and measures, as
 * a user would, its time to first token and its time per output token from the SSE stream.
 */
import { Agent, request } from 'node:http';
import type { PlannedRequest, RequestClass } from './workload';

/** What the client saw of one request. */
export interface Outcome {
  readonly kind: RequestClass;
  /** When it was sent, ms after the start. */
  readonly sentAt: number;
  /** When its answer ended, ms after the start. */
  readonly endedAt: number;
  readonly status: number;
  /** Ms from sending to the first token's chunk; NaN if none came. */
  readonly ttftMs: number;
  /** Mean ms between token chunks after the first; NaN with fewer than two. */
  readonly tpotMs: number;
  readonly tokens: number;
  /** The rank that served it (the mock's `x-mock-rank`); -1 if unknown. */
  readonly rank: number;
  /** `predicted_ttft_ms` of the router's decision header; undefined when the decision had none. */
  readonly predictedTtftMs: number | undefined;
}

const TOKEN_CHUNK = '"delta":{"content"';
const agent = new Agent({ keepAlive: true, maxSockets: Infinity });

/** Sends one request to `base` with `headers`; resolves once its stream ends. */
function send(base: URL, planned: PlannedRequest, headers: Record<string, string>, start: number): Promise<Outcome> {
  return new Promise((resolve) => {
    const sentAt = performance.now() - start;
    const body = Buffer.from(planned.body);
    let first = NaN;
    let last = NaN;
    let tokens = 0;
    let carry = '';
    const req = request(
      { host: base.hostname, port: base.port, path: '/v1/chat/completions', method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': body.length, ...headers } },
      (res) => {
        const decision = String(res.headers['x-dp-router-decision'] ?? '');
        const predicted = /predicted_ttft_ms=(\d+)/.exec(decision);
        const rank = Number(res.headers['x-mock-rank'] ?? -1);
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          const now = performance.now() - start;
          const text = carry + chunk;
          let at = text.indexOf(TOKEN_CHUNK);
          let seen = 0;
          while (at >= 0) {
            seen++;
            at = text.indexOf(TOKEN_CHUNK, at + TOKEN_CHUNK.length);
          }
          // A marker split across two reads is counted in the next one.
          carry = text.slice(-TOKEN_CHUNK.length);
          if (seen > 0) {
            if (tokens === 0) first = now;
            last = now;
            tokens += seen;
          }
        });
        res.on('end', () => {
          resolve({
            kind: planned.kind,
            sentAt,
            endedAt: performance.now() - start,
            status: res.statusCode ?? 0,
            ttftMs: first - sentAt,
            tpotMs: tokens > 1 ? (last - first) / (tokens - 1) : NaN,
            tokens,
            rank,
            predictedTtftMs: predicted === null ? undefined : Number(predicted[1]),
          });
        });
        res.on('error', () => resolve({ kind: planned.kind, sentAt, endedAt: performance.now() - start, status: 0, ttftMs: NaN, tpotMs: NaN, tokens, rank, predictedTtftMs: undefined }));
      },
    );
    req.on('error', () => resolve({ kind: planned.kind, sentAt, endedAt: performance.now() - start, status: 0, ttftMs: NaN, tpotMs: NaN, tokens, rank: -1, predictedTtftMs: undefined }));
    req.end(body);
  });
}

/** Sends every planned request at its time; `headersOf` gives each one's extra headers. */
export async function runOpenLoop(url: string, planned: readonly PlannedRequest[], headersOf: (planned: PlannedRequest) => Record<string, string>): Promise<Outcome[]> {
  const base = new URL(url);
  const start = performance.now();
  const pending: Array<Promise<Outcome>> = [];
  for (const one of planned) {
    const wait = one.at - (performance.now() - start);
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    pending.push(send(base, one, headersOf(one), start));
  }
  return Promise.all(pending);
}

/** Runs `clients` closed loops over `planned` (each sends its next request when the last ended) for `durationMs`; resolves with the outcomes. */
export async function runClosedLoop(url: string, planned: readonly PlannedRequest[], clients: number, durationMs: number): Promise<Outcome[]> {
  const base = new URL(url);
  const start = performance.now();
  const outcomes: Outcome[] = [];
  let next = 0;
  const client = async () => {
    while (performance.now() - start < durationMs) {
      outcomes.push(await send(base, planned[next++ % planned.length], {}, start));
    }
  };
  await Promise.all(Array.from({ length: clients }, client));
  return outcomes;
}
