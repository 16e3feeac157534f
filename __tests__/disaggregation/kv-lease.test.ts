/**
 * NIXL's KV lease (vLLM 52a31cc, #41383): a prefill keeps a request's blocks for
 * `kv_lease_duration` (30 s; nixl/scheduler.py:70-73, 642) and only the decode engine's
 * heartbeats renew it, once the decode request has reached it (scheduler.py:1775
 * `on_new_request`). Nothing between the prefill answer and the decode engine may hold the decode
 * leg past that: admission seats a request before its prefill leg, and the decode leg's connects
 * are cut to fit the lease left. Real sockets: mock prefill and decode servers, and a server
 * that never accepts connections (a full accept queue: the kernel drops the SYNs).
 */
import { describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { connect, type Socket } from 'node:net';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import type { Endpoint, Options, Policy } from '../../lib';
import { closedAfterEach, keptIn, exchange, metricValue, sleep, startGateway, waitFor, type TestGateway } from '../helpers';

const started = closedAfterEach();
const COMPLETION = '{"model":"mock-model","prompt":"The quick brown fox jumps over the lazy dog.","max_tokens":3}';

const mock = (options: MockVllmOptions): Promise<MockVllm> => keptIn(started, startMockVllm({ recordBodies: true, dataParallelSize: 1, ...options }));
const gateway = (options: Options): Promise<TestGateway> => keptIn(started, startGateway(options));

/** Always the first candidate: the order of `upstreams` decides. */
const FIRST: Policy = { name: 'first', pick: (candidates: readonly Endpoint[]) => candidates[0] };

/**
 * A port whose connections never complete: a socket listening with a backlog of 0 that never
 * accepts, its queue filled, so the kernel drops further SYNs and a connect waits.
 */
async function blackHole(): Promise<string> {
  const child: ChildProcessWithoutNullStreams = spawn('python3', [
    '-c',
    'import socket, sys, time\ns = socket.socket()\ns.bind(("127.0.0.1", 0))\ns.listen(0)\nprint(s.getsockname()[1], flush=True)\ntime.sleep(600)',
  ]);
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout.once('data', (chunk: Buffer) => resolve(Number(chunk.toString().trim())));
    child.once('error', reject);
  });
  const fillers: Socket[] = [];
  for (let index = 0; index < 3; index++) {
    const socket = connect(port, '127.0.0.1');
    socket.on('error', () => undefined);
    fillers.push(socket);
  }
  started.push({
    close: () => {
      for (const socket of fillers) socket.destroy();
      child.kill();
    },
  });
  // The queue is full once a connect no longer completes.
  await sleep(50);
  return `http://127.0.0.1:${port}`;
}

describe('the mock prefill server', () => {
  it('releases the blocks after its lease: a decode that comes later fails as vLLM fails it', async () => {
    const prefill = await mock({ role: 'prefill', kvLeaseMs: 1 });
    const decode = await mock({ role: 'decode' });
    const answer = await exchange(prefill.url, { body: '{"prompt":"x","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}' });
    const params = JSON.parse(answer.body).kv_transfer_params;
    await sleep(20);
    const late = await exchange(decode.url, { body: JSON.stringify({ prompt: 'x', kv_transfer_params: params }) });
    expect(late.status).toBe(500);
    expect(JSON.parse(late.body).error).toEqual({ message: 'Internal server error', type: 'InternalServerError', param: null, code: 500 });
  });
});

describe('the decode leg under the KV lease', () => {
  it('cuts a connect that does not complete to its share of the lease, and reaches another decode server in time', async () => {
    const hole = await blackHole();
    const prefill = await mock({ role: 'prefill', kvLeaseMs: 3_000 });
    const decode = await mock({ role: 'decode', startRank: 1 });
    const front = await gateway({
      upstreams: [
        { url: prefill.url, name: 'p', role: 'prefill' },
        { url: hole, name: 'hole', role: 'decode' },
        { url: decode.url, name: 'd', startRank: 1, role: 'decode' },
      ],
      policy: FIRST,
      // Far longer than the lease: without the cut, the decode leg would wait this long first.
      timeouts: { connectMs: 60_000 },
      disaggregation: { connector: 'nixl', kvLeaseMs: 3_000, prefillPolicy: FIRST },
      exposeDecision: true,
    });
    const answer = await exchange(front.url, { body: COMPLETION });
    expect(answer.status).toBe(200);
    expect(JSON.parse(answer.body).choices[0].text).toMatch(/^rank 1:/);
    expect(answer.headers['x-dp-router-decision']).toBe('upstream=d; rank=1; source=assigned; prefill=p@0');
    expect(await metricValue(front.registry, 'dp_router_upstream_errors_total', { upstream: 'hole', kind: 'timeout' })).toBe(1);
    expect(await metricValue(front.registry, 'dp_router_retries_total', { upstream: 'hole' })).toBe(1);
    expect(decode.stats().requests.map((record) => record.leg)).toEqual(['decode']);
  }, 20_000);

  it('waits in admission before the prefill leg, never between the legs', async () => {
    const prefill = await mock({ role: 'prefill' });
    const decode = await mock({ role: 'decode', decodeMsPerToken: 50 });
    const front = await gateway({
      upstreams: [
        { url: prefill.url, name: 'p', role: 'prefill' },
        { url: decode.url, name: 'd', role: 'decode' },
      ],
      admission: { maxInflightPerRank: 1 },
      disaggregation: { connector: 'nixl' },
    });
    const first = exchange(front.url, { body: COMPLETION });
    await waitFor(() => decode.stats().requests.length === 1);
    const second = exchange(front.url, { body: COMPLETION });
    await waitFor(async () => (await metricValue(front.registry, 'dp_router_queue_depth')) === 1);
    // Queued for the decode rank: its prefill leg has not been sent, so no lease is running.
    expect(prefill.stats().requests).toHaveLength(1);
    expect((await first).status).toBe(200);
    expect((await second).status).toBe(200);
    expect(prefill.stats().requests).toHaveLength(2);
    expect(decode.stats().requests.map((record) => record.leg)).toEqual(['decode', 'decode']);
  });
});
