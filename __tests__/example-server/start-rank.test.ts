/**
 * `--upstream URL@RANKS` whose list does not start at 0, in front of the mock started with
 * `vllm serve`'s own data-parallel flags. vLLM 52a31cc reads X-data-parallel-rank as an index
 * from 0 into the engines its API server manages (vllm/v1/engine/core_client.py:596-606,
 * vllm/v1/engine/input_processor.py:252-259): on `vllm serve --data-parallel-size 8` (internal
 * load balancing, engines 0–7) rank 3 is header 3; on a hybrid node started with
 * `--data-parallel-start-rank 4` (engines 4–7) rank 6 is header 2. Its /metrics label each
 * engine with its global rank (vllm/v1/metrics/loggers.py:429-434). The mock names the engine
 * that answered in `x-mock-rank`.
 */
import { afterEach, describe, expect, it } from '@jest/globals';
import { parseCommandLine, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway, type RunningGateway } from '../../example-server/gateway';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { parseMockCommandLine } from '../../example-server/mock-vllm/command';
import { serve } from '../helpers/app';

const open: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((thing) => thing.close()));
});

/** The mock as `vllm serve` would be started with these flags, on any port. */
async function mockServing(...vllmFlags: string[]): Promise<MockVllm> {
  const mock = await startMockVllm({ ...(parseMockCommandLine(vllmFlags) as MockVllmOptions), port: 0 });
  open.push(mock);
  return mock;
}

async function gatewayWith(...argv: string[]): Promise<RunningGateway> {
  const gateway = await startExampleGateway(parseCommandLine(['--port', '0', '--trust-hints', ...argv]) as GatewaySettings);
  open.push(gateway);
  return gateway;
}

/** The engine that answered a completion pinned to `rank` by a trusted hint. */
async function engineFor(gateway: RunningGateway, rank: number): Promise<string | null> {
  const response = await fetch(`${gateway.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) },
    body: '{"model":"mock-model","prompt":"hi","max_tokens":2}',
  });
  expect(response.status).toBe(200);
  await response.arrayBuffer();
  return response.headers.get('x-mock-rank');
}

/** The rank header copies of each completion the mock received. */
const completions = (mock: MockVllm) => mock.stats().requests.filter((record) => record.path === '/v1/completions').map((record) => record.rankHeaders);

describe('--upstream URL@RANKS not starting at 0', () => {
  it('48.2: --upstream URL@1,3,5,7 on an internal-LB server (vllm serve --data-parallel-size 8) sends headers 1,3,5,7: each rank reaches its own engine', async () => {
    const mock = await mockServing('--data-parallel-size', '8');
    const gateway = await gatewayWith('--upstream', `${mock.url}@1,3,5,7`);
    for (const rank of [1, 3, 5, 7]) expect([rank, await engineFor(gateway, rank)]).toEqual([rank, String(rank)]);
    expect(completions(mock)).toEqual([['1'], ['3'], ['5'], ['7']]);
    expect(gateway.summary).toContain(`→ ${mock.url} ranks 1,3,5,7 (X-data-parallel-rank 1,3,5,7);`);
  });

  it('48.2: --upstream URL@4-7 on a hybrid node (--data-parallel-start-rank 4) still sends headers 0-3, and the start-up line says so', async () => {
    const mock = await mockServing('--data-parallel-size', '8', '--data-parallel-size-local', '4', '--data-parallel-start-rank', '4');
    const gateway = await gatewayWith('--upstream', `${mock.url}@4-7`);
    for (const rank of [4, 5, 6, 7]) expect([rank, await engineFor(gateway, rank)]).toEqual([rank, String(rank)]);
    expect(completions(mock)).toEqual([['0'], ['1'], ['2'], ['3']]);
    expect(gateway.summary).toContain(`→ ${mock.url} ranks 4-7 (X-data-parallel-rank 0-3);`);
  });

  it('48.2: refuses to start when /metrics cannot tell the first engine, naming --start-rank; --start-rank (or vLLM\'s --data-parallel-start-rank) starts it', async () => {
    // A server whose /metrics is not vLLM's: nothing says where its engines start.
    const server = await serve((req, res) => {
      if (req.url === '/metrics') {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[]}');
    });
    open.push(server);
    await expect(gatewayWith('--upstream', `${server.url}@1,3`)).rejects.toThrow(
      `--upstream ${server.url}@1,3: the rank header is an index from 0 into the engines that server runs, and its first engine is not known: give --start-rank N (its --data-parallel-start-rank: 0 for \`vllm serve --data-parallel-size N\`, the node's start rank for a hybrid node); its /metrics would say (${server.url}/metrics answered 404)`,
    );
    for (const flag of ['--start-rank', '--data-parallel-start-rank']) {
      const gateway = await gatewayWith('--upstream', `${server.url}@1,3`, flag, '0');
      expect(gateway.summary).toContain(`→ ${server.url} ranks 1,3 (X-data-parallel-rank 1,3);`);
    }
    // A list from 0 needs no answer: its server's first engine is 0.
    expect((await gatewayWith('--upstream', `${server.url}@0,2`)).summary).toContain('ranks 0,2 (X-data-parallel-rank 0,2)');
  });

  it('48.2: refuses ranks the server\'s /metrics do not name, and an --upstream-dns list not from 0 without --start-rank', async () => {
    const mock = await mockServing('--data-parallel-size', '8', '--data-parallel-size-local', '4', '--data-parallel-start-rank', '4');
    await expect(gatewayWith('--upstream', `${mock.url}@2-5`)).rejects.toThrow(`--upstream ${mock.url}@2,3,4,5: its /metrics name engines 4,5,6,7, not ranks 2,3: give the ranks that server runs`);
    expect(() => parseCommandLine(['--upstream-dns', 'vllm.test:8000@4-7'])).toThrow(/^--upstream-dns vllm\.test:8000@4-7: the rank header is an index from 0 .*give --start-rank N/);
    expect((parseCommandLine(['--upstream-dns', 'vllm.test:8000@4-7', '--start-rank', '4']) as GatewaySettings).upstreams[0]).toMatchObject({ startRank: 4, ranks: [4, 5, 6, 7] });
  });
});

describe("vLLM's own flag names", () => {
  it('48.12: takes --data-parallel-size and --data-parallel-start-rank as --dp-size and --start-rank, and hints at the vllm serve flags it does not take', () => {
    // Without @RANKS: every rank from the start rank on, no `ranks` list (which --discover would not route past, 48.3).
    expect(parseCommandLine(['--upstream', 'http://h:8000', '--data-parallel-size', '8'])).toMatchObject({ upstreams: [{ url: 'http://h:8000', startRank: 0, dataParallelSize: 8 }] });
    expect((parseCommandLine(['--upstream', 'http://h:8000', '--data-parallel-size', '8']) as GatewaySettings).upstreams[0]).not.toHaveProperty('ranks');
    expect(parseCommandLine(['--upstream', 'http://h:8000', '--data-parallel-size=4', '--data-parallel-start-rank=4'])).toMatchObject({ upstreams: [{ startRank: 4, dataParallelSize: 4 }] });
    expect((parseCommandLine(['--data-parallel-size', '2']) as GatewaySettings).dpSize).toBe(2);
    expect(() => parseCommandLine(['--dp-size', '4', '--data-parallel-size', '8'])).toThrow(/^--dp-size is given twice \("4", then "8"\)/);
    expect(() => parseCommandLine(['--data-parallel-size', 'x'])).toThrow('--data-parallel-size must be an integer from 1 to 65536, got "x"');
    expect(() => parseCommandLine(['--data-parallel-size-local', '4'])).toThrow(/^--data-parallel-size-local is a vllm serve flag the gateway does not take: give each server the global ranks it runs as --upstream URL@RANKS/);
  });
});
