import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { allIdle, type EchoUpstream, parseExposition, rawRequest, seedScenario, startEchoUpstream, startGateway, type TestGateway, waitFor } from '../helpers';

const ROUTABLE = ['0', '2', '4', '6'];
let upstream: EchoUpstream;
let reassigning: TestGateway;
let rejecting: TestGateway;

beforeAll(async () => {
  upstream = await startEchoUpstream();
  reassigning = await startGateway(seedScenario(upstream.url, { hints: { trust: true, onInvalid: 'reassign', bodyField: 'data_parallel_rank' } }));
  rejecting = await startGateway(seedScenario(upstream.url, { hints: { trust: true, onInvalid: 'reject', bodyField: 'data_parallel_rank' } }));
});
afterAll(async () => {
  await reassigning.close();
  await rejecting.close();
  await upstream.close();
});

/** Characters that a header value may carry on the wire, with the ones vLLM's int() would read as digits. */
const valueChar = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom('0', '1', '2', '3', '4', '6', '9') },
  { weight: 2, arbitrary: fc.constantFrom(' ', '\t', '+', '-', '_', ',', '.', 'x', 'e', '٣', '３', '²', 'é') },
  { weight: 1, arbitrary: fc.string({ unit: fc.integer({ min: 0x21, max: 0x7e }).map((code) => String.fromCharCode(code)), maxLength: 1 }) },
);
const hintValue = fc.string({ unit: valueChar, maxLength: 14 }).map((value) => value.trim() === value ? value : value.trim());
/** The hint header's name in a random letter case. */
const hintName = fc
  .array(fc.boolean(), { minLength: 20, maxLength: 20 })
  .map((upper) => [...'x-data-parallel-rank'].map((char, index) => (upper[index] ? char.toUpperCase() : char)).join(''));
const hintLines = fc.array(fc.tuple(hintName, hintValue), { maxLength: 4 });

const statusOf = (answer: string) => Number(/^HTTP\/1\.1 (\d{3}) /.exec(answer)?.[1] ?? 0);

async function send(gateway: TestGateway, lines: Array<[string, string]>, body = '{"prompt":"p"}'): Promise<{ status: number; answer: string }> {
  const headerLines = lines.map(([name, value]) => `${name}: ${value}\r\n`).join('');
  const answer = await rawRequest(
    gateway.url,
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${headerLines}Connection: close\r\n\r\n${body}`,
  );
  return { status: statusOf(answer), answer };
}

describe('properties over hostile input', () => {
  it('reassign mode: any hint lines give 200 and exactly one routable, clean rank header upstream', async () => {
    await fc.assert(
      fc.asyncProperty(hintLines, async (lines) => {
        const before = upstream.seen.length;
        const { status } = await send(reassigning, lines);
        expect(status).toBe(200);
        expect(upstream.seen).toHaveLength(before + 1);
        const forwarded = upstream.seen[before].rankHeaders;
        expect(forwarded).toHaveLength(1);
        expect(ROUTABLE).toContain(forwarded[0]);
        const valid = lines.length === 1 && ROUTABLE.includes(lines[0][1]);
        if (valid) expect(forwarded[0]).toBe(lines[0][1]);
      }),
      { numRuns: 150 },
    );
    await waitFor(() => allIdle(reassigning));
  });

  it('reject mode: an invalid hint is a contract 400 that forwards nothing and never echoes the value', async () => {
    await fc.assert(
      fc.asyncProperty(hintLines, async (lines) => {
        const before = upstream.seen.length;
        const { status, answer } = await send(rejecting, lines);
        const valid = lines.length === 0 || (lines.length === 1 && ROUTABLE.includes(lines[0][1]));
        if (valid) {
          expect(status).toBe(200);
          expect(upstream.seen[before].rankHeaders).toEqual(lines.length === 1 ? [lines[0][1]] : [expect.stringMatching(/^[0246]$/)]);
          return;
        }
        expect(status).toBe(400);
        expect(upstream.seen).toHaveLength(before);
        const body = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4));
        expect(body).toEqual({ error: { message: expect.any(String), type: 'BadRequestError', param: 'x-data-parallel-rank', code: 400 } });
        // A malformed value is never echoed; an out-of-range one is named only as the number it parsed to.
        // (Values with a digit: a short run of letters may occur in the fixed message by chance.)
        for (const [, value] of lines) if (/[0-9]/.test(value) && !/^(?:0|[1-9][0-9]{0,9})$/.test(value)) expect(body.error.message).not.toContain(value);
      }),
      { numRuns: 150 },
    );
    await waitFor(() => allIdle(rejecting));
  });

  it('any JSON body: 200 with the bytes forwarded unchanged (an object without the hint field gains it first), or a contract 400; never a crash', async () => {
    const bodies = fc.oneof(
      fc.jsonValue().map((value) => JSON.stringify(value)),
      fc.record({ prompt: fc.string(), data_parallel_rank: fc.jsonValue() }).map((value) => JSON.stringify(value)),
      fc.string({ maxLength: 40 }),
    );
    await fc.assert(
      fc.asyncProperty(bodies, async (body) => {
        const before = upstream.seen.length;
        const { status, answer } = await send(rejecting, [], body);
        expect([200, 400]).toContain(status);
        if (status === 200) {
          const [rank] = upstream.seen[before].rankHeaders;
          let value: unknown;
          try {
            value = JSON.parse(body);
          } catch {
            // Not JSON (an empty body is no body): forwarded as it came.
          }
          // The upstream always reads the router's rank in the field (item 41.17): added first to an object without it.
          const object = typeof value === 'object' && value !== null && !Array.isArray(value) ? value : undefined;
          const gains = object !== undefined && !Object.hasOwn(object, 'data_parallel_rank');
          const empty = gains && Object.keys(object).length === 0;
          expect(upstream.seen[before].body.toString('utf8')).toBe(gains ? body.replace(/^\s*\{/, (open) => `${open}"data_parallel_rank":${rank}${empty ? '' : ','}`) : body);
          expect(upstream.seen[before].rankHeaders).toHaveLength(1);
          expect(ROUTABLE).toContain(rank);
        } else {
          expect(upstream.seen).toHaveLength(before);
          expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)).error).toMatchObject({ type: 'BadRequestError', code: 400 });
        }
      }),
      { numRuns: 150 },
    );
    await waitFor(() => allIdle(rejecting));
  });

  it('takes no metric label value from the client, whatever it sent', async () => {
    const allowed: Record<string, string[]> = {
      upstream: ['node-a'],
      // 'vllm': the fixed label of requests vLLM balances itself (paths it does not route by header).
      rank: [...ROUTABLE, 'vllm'],
      // Each closed set: decisions and hints, then route receipts' (cached tokens by source, receipts by outcome).
      source: ['hint', 'assigned', 'predicted', 'reported'],
      outcome: ['accepted', 'untrusted', 'malformed', 'out_of_range', 'unavailable', 'confirmed', 'elsewhere', 'unseen', 'cached', 'met', 'missed_ttft', 'missed_tpot', 'shed', 'taken', 'refused_single_source'],
      // Upstream errors, then the SLO prediction error's (docs/slo-routing.md).
      kind: ['connect', 'timeout', 'reset', 'status_5xx', 'ttft', 'tpot'],
      evidence: ['answer', 'metrics'],
      // Verdicts that change routing for everyone (lib/verdicts).
      verdict: ['rank_header', 'elsewhere', 'misses', 'tokens', 'tokenizer', 'ejection'],
    };
    for (const gateway of [reassigning, rejecting]) {
      for (const sample of parseExposition(await gateway.registry.metrics())) {
        for (const [label, value] of Object.entries(sample.labels)) if (label !== 'le') expect(allowed[label]).toContain(value);
      }
    }
  });
});
