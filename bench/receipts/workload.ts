/**
 * The traffic of `bench:receipts`: chats behind a few shared system prompts, each with a new
 * question (new blocks to store), one in ten a repeat of an earlier prompt (nothing new), half of
 * them streamed; with `completions`, every third request a text completion. Deterministic (seeded).
 */
import { seededRng } from '../routing/rng';

const SYSTEMS = 16;
const WORDS = ['cache', 'engine', 'rank', 'prefix', 'token', 'router', 'block', 'event', 'stream', 'usage', 'header', 'balance'];

/** One request: its path and body. */
export interface BenchRequest {
  readonly path: string;
  readonly body: string;
}

/** Request `i` of the workload (`seed` picks another sequence). */
export function workload(seed: number, completions = false): (i: number) => BenchRequest {
  const random = seededRng(seed);
  const sent: BenchRequest[] = [];
  const system = (k: number) => `Session ${k}. You are a careful assistant for team ${k}; answer in short sentences and cite the manual. `.repeat(4);
  const question = () => Array.from({ length: 24 }, () => WORDS[Math.floor(random() * WORDS.length)]).join(' ');
  return (i) => {
    if (sent.length > 20 && random() < 0.1) return sent[Math.floor(random() * sent.length)];
    const stream = random() < 0.5;
    const k = Math.floor(random() * SYSTEMS);
    const request: BenchRequest =
      completions && i % 3 === 2
        ? { path: '/v1/completions', body: JSON.stringify({ model: 'mock-model', prompt: `${system(k)}\n${question()} (${i})`, max_tokens: 4, stream }) }
        : {
            path: '/v1/chat/completions',
            body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'system', content: system(k) }, { role: 'user', content: `${question()} (${i})` }], max_tokens: 4, stream }),
          };
    if (sent.length < 2000) sent.push(request);
    return request;
  };
}

/** Sends one request to `base`; resolves with its status once the answer is read. */
export async function post(base: string, request: BenchRequest, client?: number): Promise<number> {
  // Each client its own API key: a verdict needs evidence from several (verdicts.minSources).
  const headers: Record<string, string> = client === undefined ? { 'content-type': 'application/json' } : { 'content-type': 'application/json', authorization: `Bearer bench-client-${client}` };
  const res = await fetch(base + request.path, { method: 'POST', headers, body: request.body });
  await res.arrayBuffer();
  return res.status;
}

/**
 * Sends requests of `next` with `concurrency` clients until `stop(sent)` or `limit` requests;
 * resolves with how many were sent. A status other than 200 fails the run.
 */
export async function drive(base: string | ((i: number) => string), next: (i: number) => BenchRequest, concurrency: number, limit: number, stop: (sent: number) => boolean = () => false): Promise<number> {
  let sent = 0;
  const client = async (id: number) => {
    while (sent < limit && !stop(sent)) {
      const i = sent++;
      const status = await post(typeof base === 'string' ? base : base(i), next(i), id);
      if (status !== 200) throw new Error(`request ${i} answered ${status}`);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, (_, id) => client(id)));
  return sent;
}
