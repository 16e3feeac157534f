import { describe, expect, it } from '@jest/globals';
import { parseCommandLine, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway } from '../../example-server/gateway';
import { closedAfterEach, exchange } from '../helpers';
import { startRedis } from './helpers';

const started = closedAfterEach();

describe('example server admission flags', () => {
  it('queues past --max-inflight-per-rank in front of a mock limited by --mock-max-num-seqs, with budgets in --redis', async () => {
    const redis = await startRedis();
    started.push({ close: () => redis.stop() });
    const settings = parseCommandLine(
      ['--port', '0', '--dp-size', '1', '--mock-decode-ms', '5', '--mock-max-num-seqs', '1', '--max-inflight-per-rank', '1', '--queue-max', '8', '--queue-timeout-ms', '10000', '--tenant-header', 'x-tenant-id', '--trust-tenant', '--tokens-per-minute', '1000000', '--redis', redis.url, '--expose-decision'],
      {},
    ) as GatewaySettings;
    const gateway = await startExampleGateway(settings);
    started.push(gateway);
    const body = JSON.stringify({ model: 'mock-model', prompt: 'hello', max_tokens: 4, stream: true });
    const answers = await Promise.all(Array.from({ length: 4 }, (_, i) => exchange(gateway.url, { body, headers: { 'x-tenant-id': `t${i % 2}` } })));
    expect(answers.map((answer) => answer.status)).toEqual([200, 200, 200, 200]);
    expect(answers.some((answer) => /waited_ms=[1-9]/.test(String(answer.headers['x-dp-router-decision'])))).toBe(true);
    expect(gateway.mock!.stats().perRank[0].peakConcurrent).toBe(1);
    const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
    expect(metrics).toMatch(/dp_router_admission_total\{outcome="queued"\} [1-9]/);
    expect(metrics).toMatch(/dp_router_token_store_errors_total 0/);
  });
});
