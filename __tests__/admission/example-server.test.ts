import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import pino from 'pino';
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

describe('the example server\'s /readyz with token budgets in Redis', () => {
  const start = async (redisUrl: string) => {
    const settings = parseCommandLine(['--port', '0', '--dp-size', '1', '--tokens-per-minute', '1000', '--redis', redisUrl], {}) as GatewaySettings;
    const errors: string[] = [];
    const warnings: string[] = [];
    // pino's JSON lines, by level (40 warn, 50 error).
    const lines = new Writable({
      write(chunk: Buffer, _encoding, done) {
        for (const line of chunk.toString().split('\n').filter(Boolean)) {
          const { level, msg } = JSON.parse(line) as { level: number; msg: string };
          if (level === 50) errors.push(msg);
          else if (level === 40) warnings.push(msg);
        }
        done();
      },
    });
    const gateway = await startExampleGateway(settings, pino({ level: 'info' }, lines));
    started.push(gateway);
    const ready = async () => {
      const answer = await fetch(`${gateway.url}/readyz`);
      return { status: answer.status, body: (await answer.json()) as { status: string; degraded?: string[] } };
    };
    return { gateway, ready, errors, warnings };
  };

  it('48.13: not ready, and an error logged, while Redis refuses the --redis password from the start', async () => {
    const redis = await startRedis(undefined, ['--requirepass', 'pw']);
    started.push({ close: () => redis.stop() });
    const { ready, errors, warnings } = await start(`redis://:wrong@127.0.0.1:${redis.port}`);
    await waitFor(() => errors.length >= 2);
    expect(errors.join('\n')).toMatch(/WRONGPASS/);
    expect(warnings.join('\n')).not.toMatch(/WRONGPASS/);
    const { status, body } = await ready();
    expect(status).toBe(503);
    expect(body.status).toMatch(/refuses its credentials/);
  });

  it('48.13: ready but flagged degraded while Redis is down (budgets fail open), and ready again when it is back', async () => {
    const redis = await startRedis(undefined, ['--requirepass', 'pw']);
    started.push({ close: () => redis.stop() });
    const { ready } = await start(`redis://:pw@127.0.0.1:${redis.port}`);
    await waitFor(async () => (await ready()).body.degraded === undefined);
    expect(await ready()).toEqual({ status: 200, body: { status: 'ready', healthyEndpoints: 1 } });
    await redis.stop();
    await waitFor(async () => (await ready()).body.degraded !== undefined);
    const down = await ready();
    expect(down.status).toBe(200);
    expect(down.body.status).toBe('ready');
    expect(down.body.degraded![0]).toMatch(/token budgets not enforced/);
    const again = await startRedis(redis.port, ['--requirepass', 'pw']);
    started.push({ close: () => again.stop() });
    await waitFor(async () => (await ready()).body.degraded === undefined, 10_000);
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
