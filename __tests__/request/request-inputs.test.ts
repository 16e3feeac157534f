import { afterEach, describe, expect, it } from '@jest/globals';
import type { IncomingMessage } from 'node:http';
import type { Options } from '../../lib';
import { parseOptions } from '../../lib/options';
import { buildPolicy } from '../../lib/policies/by-name';
import { BodyBudget } from '../../lib/http/body-budget';
import { createRequestInputs, NO_HINT, type RequestInputs } from '../../lib/request/request-inputs';
import { EndpointTable } from '../../lib/upstreams/endpoints';
import { exchange, serve } from '../helpers';

const running: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((thing) => thing.close()));
});

const url = 'http://127.0.0.1:1';

function inputsOf(options: Partial<Options>): { inputs: RequestInputs; table: EndpointTable } {
  const config = parseOptions({ upstreams: [{ url, dataParallelSize: 8, ranks: [0, 2, 4, 6] }], ...options } as Options, 'dpRank');
  const table = new EndpointTable(config.upstreams);
  return { inputs: createRequestInputs(config, buildPolicy(config.policy, config), table), table };
}

/** Sends one request to a real server and returns what `read` made of the request there. */
async function received<T>(read: (req: IncomingMessage) => T, request: Parameters<typeof exchange>[1] = {}): Promise<T> {
  let result: T | undefined;
  const server = await serve((req, res) => {
    result = read(req);
    req.resume();
    res.end();
  });
  running.push(server);
  await exchange(server.url, request);
  return result as T;
}

describe('request inputs: the header hint', () => {
  const { inputs, table } = inputsOf({ hints: { trust: true } });

  it.each([
    ['no header', {}, NO_HINT],
    ['a routable rank', { 'x-data-parallel-rank': '4' }, { outcome: 'accepted', rank: 4, param: 'x-data-parallel-rank' }],
    ['a rank `ranks` excludes', { 'x-data-parallel-rank': '3' }, { outcome: 'out_of_range', rank: 3, param: 'x-data-parallel-rank' }],
    ['a signed value', { 'x-data-parallel-rank': '+4' }, { outcome: 'malformed', param: 'x-data-parallel-rank' }],
    ['two equal lines', { 'x-data-parallel-rank': ['4', '4'] }, { outcome: 'malformed', param: 'x-data-parallel-rank' }],
  ])('%s', async (_name, headers, verdict) => {
    expect(await received((req) => inputs.headerHint(req, true), { headers })).toEqual(verdict);
  });

  it('counts a hint from an untrusted caller as untrusted, without parsing it', async () => {
    expect(await received((req) => inputs.headerHint(req, false), { headers: { 'x-data-parallel-rank': 'garbage' } })).toEqual({ outcome: 'untrusted', param: 'x-data-parallel-rank' });
  });

  it('judges a rank whose every endpoint is down unavailable', async () => {
    const endpoint = table.all.find((candidate) => candidate.rank === 2)!;
    endpoint.probeUp = false;
    table.updateHealth(endpoint);
    try {
      expect(await received((req) => inputs.headerHint(req, true), { headers: { 'x-data-parallel-rank': '2' } })).toMatchObject({ outcome: 'unavailable', rank: 2 });
    } finally {
      endpoint.probeUp = true;
      table.updateHealth(endpoint);
    }
  });
});

describe('request inputs: the body', () => {
  it('wants the body only for what routing reads from it', async () => {
    expect(await received((req) => inputsOf({ policy: 'round-robin' }).inputs.wantsBody(req))).toBe(false);
    expect(await received((req) => inputsOf({ policy: 'prefix-aware' }).inputs.wantsBody(req))).toBe(true);
    expect(await received((req) => inputsOf({ hints: { bodyField: 'data_parallel_rank' } }).inputs.wantsBody(req))).toBe(true);
    const affinity = inputsOf({ policy: 'session-affinity', affinity: { header: 'x-session-id', bodyField: 'user' } }).inputs;
    // A session key in the header makes the body unnecessary.
    expect(await received((req) => affinity.wantsBody(req), { headers: { 'x-session-id': 's1' } })).toBe(false);
    expect(await received((req) => affinity.wantsBody(req))).toBe(true);
  });

  it('judges a body hint field as the header: a JSON integer ≥ 0, once', () => {
    const { inputs } = inputsOf({ hints: { trust: true, bodyField: 'data_parallel_rank' } });
    const judge = (body: string) => {
      const view = inputs.viewOf(Buffer.from(body), undefined);
      return typeof view === 'string' ? view : inputs.bodyHint(view, true);
    };
    expect(judge('{"data_parallel_rank":6,"prompt":"x"}')).toEqual({ outcome: 'accepted', rank: 6, param: 'data_parallel_rank' });
    expect(judge('{"data_parallel_rank":"6"}')).toMatchObject({ outcome: 'malformed' });
    expect(judge('{"data_parallel_rank":4.5}')).toMatchObject({ outcome: 'malformed' });
    expect(judge('{"data_parallel_rank":1}')).toMatchObject({ outcome: 'out_of_range', rank: 1 });
    expect(judge('{"prompt":"x"}')).toBe(NO_HINT);
    // Two copies may be read differently by two decoders, as two header lines may.
    expect(judge('{"data_parallel_rank":6,"data_parallel_rank":6}')).toMatchObject({ outcome: 'malformed' });
    expect(judge('{"data_parallel_rank":')).toBe('Request body is not valid JSON.');
  });

  it('reads the prompt of a completion and of a chat, and the session key from header or body', async () => {
    const prefix = inputsOf({ policy: 'prefix-aware' }).inputs;
    const promptOf = (body: unknown) => {
      const view = prefix.viewOf(Buffer.from(JSON.stringify(body)), undefined);
      return typeof view === 'string' ? view : prefix.prompt(view, undefined);
    };
    expect(promptOf({ prompt: 'hello there' })).toBe('hello there');
    expect(promptOf({ messages: [{ role: 'user', content: 'hi' }] })).toContain('hi');
    expect(promptOf({ max_tokens: 3 })).toBeUndefined();

    const affinity = inputsOf({ policy: 'session-affinity', affinity: { header: 'x-session-id', bodyField: 'user' } }).inputs;
    const body = affinity.viewOf(Buffer.from('{"user":"u-7"}'), undefined);
    expect(typeof body).not.toBe('string');
    expect(await received((req) => affinity.affinityKey(req, body as never, undefined), { headers: { 'x-session-id': 'from-header' } })).toBe('from-header');
    expect(await received((req) => affinity.affinityKey(req, body as never, undefined))).toBe('u-7');
  });

  it('routes as without a prompt past 262,144 JSON values in it, whatever the budget', () => {
    const { inputs } = inputsOf({ policy: 'prefix-aware' });
    // Over 1 MiB, so that the body is scanned rather than parsed whole.
    const promptOf = (body: string) => {
      const bytes = Buffer.from(body);
      expect(bytes.length).toBeGreaterThan(1024 * 1024);
      const view = inputs.viewOf(bytes, undefined);
      expect(typeof view).not.toBe('string');
      return inputs.prompt(view as never, undefined);
    };
    // A hostile shape: about 3 s of CPU per 16 MiB to decode.
    expect(promptOf(`{"messages":[${Array(400_000).fill('[]').join(',')}]}`)).toBeUndefined();
    // A long prompt of token ids is under the cap (200,001 values) and read.
    expect(promptOf(`{"prompt":[${Array(200_000).fill('12345').join(',')}]}`)).toEqual(expect.any(String));
    // The cap counts both members.
    expect(promptOf(`{"prompt":[${Array(200_000).fill('12345').join(',')}],"messages":[${Array(100_000).fill('[]').join(',')}]}`)).toBeUndefined();
  });

  it('routes as without a prompt when decoding it would pass the body budget', () => {
    const { inputs } = inputsOf({ policy: 'prefix-aware' });
    const bytes = Buffer.from(JSON.stringify({ prompt: 'y'.repeat(4000) }));
    const budget = new BodyBudget(1000);
    const lease = budget.lease();
    const view = inputs.viewOf(bytes, lease);
    expect(typeof view).not.toBe('string');
    expect(inputs.prompt(view as never, lease)).toBeUndefined();
    lease.release();
    expect(budget.used).toBe(0);
  });
});
