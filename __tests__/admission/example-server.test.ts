import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { parseCommandLine, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway } from '../../example-server/gateway';
import { closedAfterEach, exchange, freePort, waitFor } from '../helpers';
import { startRedis } from './helpers';

const ROOT = join(__dirname, '..', '..');

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

describe('the example server\'s log', () => {
  /** Runs `npm start`'s gateway with `args` and `env` until its log says `until`, then stops it; what it wrote. */
  async function logOf(args: string[], env: Record<string, string>, until: RegExp): Promise<string> {
    const child = spawn(join(ROOT, 'node_modules', '.bin', 'tsx'), [join(ROOT, 'example-server', 'main.ts'), '--port', '0', '--dp-size', '1', ...args], { cwd: ROOT, env: { ...process.env, ...env } });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<void>((resolve) => child.on('close', () => resolve()));
    try {
      await waitFor(() => until.test(output) || child.exitCode !== null, 20_000, () => `no ${until} in ${output}`);
    } finally {
      child.kill('SIGTERM');
      await exited;
    }
    return output;
  }

  it('names a Redis (from --redis or DP_ROUTER_REDIS_URL) and an OTLP endpoint without their passwords (item 41.13)', async () => {
    const [redisPort, otlpPort] = [await freePort(), await freePort()];
    const otlp = `http://otel:otlp-secret@127.0.0.1:${otlpPort}`;
    const warned = /redis redis:\/\/\S+: connect ECONNREFUSED/;
    const [flag, variable] = await Promise.all([
      logOf(['--tokens-per-minute', '1000', '--redis', `redis://:flag-secret@127.0.0.1:${redisPort}`, '--otlp-endpoint', otlp], {}, warned),
      logOf(['--tokens-per-minute', '1000'], { DP_ROUTER_REDIS_URL: `redis://user:env-secret@127.0.0.1:${redisPort}/0` }, warned),
    ]);
    for (const output of [flag, variable]) {
      expect(output).toContain('listening on');
      expect(output).not.toMatch(/secret/);
    }
    expect(flag).toContain(`redis redis://***@127.0.0.1:${redisPort}: connect ECONNREFUSED`);
    expect(flag).toContain(`"otlpEndpoint":"http://***@127.0.0.1:${otlpPort}/"`);
    expect(variable).toContain(`redis redis://***@127.0.0.1:${redisPort}/0: connect ECONNREFUSED`);
  });
});
