import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { join } from 'node:path';
import OpenAI from 'openai';
import pino from 'pino';
import request from 'supertest';
import { parseCommandLine, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway, startMockOnPort, type RunningGateway } from '../../example-server/gateway';
import { startMockVllm } from '../../example-server/mock-vllm';
import { expressMajor, serve } from '../helpers/app';
import { startRedis } from '../helpers/redis';
import { freePort, freeUdpPort } from '../helpers/ports';
import { sleep, waitFor } from '../helpers/wait';

const ROOT = join(__dirname, '..', '..');
const TSX = join(ROOT, 'node_modules', '.bin', 'tsx');

describe('the example gateway with the official openai client', () => {
  let gateway: RunningGateway;
  let client: OpenAI;

  beforeAll(async () => {
    gateway = await startExampleGateway(parseCommandLine(['--port', '0', '--policy', 'round-robin', '--expose-decision']) as GatewaySettings);
    client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  afterAll(() => gateway.close());

  it('answers a chat completion from an assigned rank', async () => {
    const { data: completion, response } = await client.chat.completions
      .create({ model: 'mock-model', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8 })
      .withResponse();
    const rank = /^rank (\d):/.exec(completion.choices[0].message.content ?? '')?.[1];
    expect(['0', '1', '2', '3']).toContain(rank);
    expect(response.headers.get('x-dp-router-decision')).toBe(`upstream=mock-vllm; rank=${rank}; source=assigned`);
    expect(completion.usage?.completion_tokens).toBe(8);
  });

  it('streams a chat completion chunk by chunk to [DONE]', async () => {
    const stream = await client.chat.completions.create({
      model: 'mock-model',
      messages: [{ role: 'user', content: 'Stream please' }],
      max_tokens: 5,
      stream: true,
    });
    const deltas: string[] = [];
    for await (const chunk of stream) deltas.push(chunk.choices[0]?.delta?.content ?? '');
    expect(deltas.length).toBeGreaterThanOrEqual(5);
    expect(deltas.join('')).toMatch(/^rank \d:/);
  });

  it('spreads round-robin requests over every rank of the mock', async () => {
    const ranks = new Set<string>();
    for (let index = 0; index < 8; index++) {
      const completion = await client.completions.create({ model: 'mock-model', prompt: `question ${index}`, max_tokens: 2 });
      ranks.add(completion.choices[0].text.slice(5, 6));
    }
    expect([...ranks].sort()).toEqual(['0', '1', '2', '3']);
    const perRank = gateway.mock!.stats().perRank;
    expect(Object.values(perRank).every((rank) => rank.requests >= 2)).toBe(true);
  });

  it('surfaces the mock vLLM error for an unknown route as the openai client would', async () => {
    // vLLM has no /v1/moderations (the mock serves /v1/embeddings, as vLLM does).
    await expect(client.moderations.create({ model: 'mock-model', input: 'x' })).rejects.toMatchObject({ status: 404 });
  });

  it('serves liveness, readiness and metrics', async () => {
    expect((await request(gateway.url).get('/healthz')).body).toEqual({ status: 'ok' });
    expect((await request(gateway.url).get('/readyz')).body).toEqual({ status: 'ready', healthyEndpoints: 4 });
    const metrics = await request(gateway.url).get('/metrics');
    expect(metrics.headers['content-type']).toMatch(/^text\/plain/);
    expect(metrics.text).toContain('dp_router_requests_total{upstream="mock-vllm",rank="3",source="assigned"}');
  });
});

// The child processes load express 5 whatever the jest project maps `express` to: run them once.
const describeProcess = expressMajor === 4 ? describe.skip : describe;

describeProcess('npm start (the process)', () => {
  const run = (args: string[]) => spawn(TSX, [join(ROOT, 'example-server', 'main.ts'), ...args], { cwd: ROOT });
  const exited = (child: ChildProcessWithoutNullStreams) =>
    new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (chunk) => (stdout += chunk));
      child.stderr.on('data', (chunk) => (stderr += chunk));
      child.on('close', (code) => resolve({ code, stdout, stderr }));
    });

  it('prints usage for --help', async () => {
    const { code, stdout } = await exited(run(['--help']));
    expect(code).toBe(0);
    expect(stdout).toContain('--upstream URL[@RANKS]');
  });

  it('exits non-zero with a one-line reason for a wrong flag', async () => {
    const [wrongValue, wrongSwitch] = await Promise.all([exited(run(['--dp-size', 'many'])), exited(run(['--trust-hints=0']))]);
    expect(wrongValue.code).toBe(2);
    expect(wrongValue.stdout).toBe('');
    expect(wrongValue.stderr.trim().split('\n')).toEqual(['express-dp-router: --dp-size must be an integer from 1 to 65536, got "many"']);
    expect(wrongSwitch.code).toBe(2);
    expect(wrongSwitch.stdout).toBe('');
    expect(wrongSwitch.stderr.trim().split('\n')).toEqual([
      'express-dp-router: --trust-hints is a switch: give it alone, or as --trust-hints=true or --trust-hints=false, got "--trust-hints=0"',
    ]);
  });

  it('exits 1 with one line naming the listener and the flag when its port is taken', async () => {
    const holder = await serve(() => undefined);
    const port = new URL(holder.url).port;
    try {
      const { code, stderr } = await exited(run(['--port', port, '--mock-port', '0']));
      expect(code).toBe(1);
      expect(stderr.trim().split('\n')).toEqual([`express-dp-router: the gateway cannot listen on 127.0.0.1:${port}: another process holds that port (EADDRINUSE); give --port N or set PORT (0: any free port)`]);
    } finally {
      await holder.close();
    }
  });

  it('logs where it listens, and on SIGTERM lets an in-flight stream finish before exiting', async () => {
    const child = run(['--port', '0', '--mock-decode-ms', '25']);
    const done = exited(child);
    const url = await new Promise<string>((resolve) => {
      child.stdout.on('data', (chunk: Buffer) => {
        const match = /listening on (http:\/\/127\.0\.0\.1:\d+) → embedded mock vLLM/.exec(chunk.toString());
        if (match) resolve(match[1]);
      });
    });
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 20, stream: true }),
    });
    const reader = response.body!.getReader();
    const first = await reader.read();
    child.kill('SIGTERM');
    let text = Buffer.from(first.value!).toString();
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += Buffer.from(chunk.value).toString();
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    const { code, stdout } = await done;
    expect(code).toBe(0);
    expect(stdout).toContain('SIGTERM: draining in-flight requests');
    await expect(fetch(`${url}/healthz`)).rejects.toThrow();
  });

  it('under npm start, ignores a second Ctrl-C to the process group during the drain and exits on a third', async () => {
    // `npm start` in a process group of its own, as a terminal runs a job: each Ctrl-C is a
    // SIGINT to every process of the group (npm and the gateway it execs), and npm forwards its
    // copy to the gateway. Presses come a human's 0.6 s apart: copies of one press arrive
    // within the gateway's SAME_SIGNAL_MS.
    const child = spawn('npm', ['start', '--silent', '--', '--port', '0', '--mock-decode-ms', '100'], { cwd: ROOT, detached: true });
    const done = exited(child);
    const interruptGroup = async () => {
      await sleep(600);
      process.kill(-child.pid!, 'SIGINT');
    };
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    const printed = (pattern: RegExp) =>
      waitFor(() => pattern.test(out), 20_000, () => `no ${pattern} in ${JSON.stringify(out)}`).then(() => pattern.exec(out)!);
    const [, url] = await printed(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
    const stream = async (maxTokens: number) => {
      const response = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: maxTokens, stream: true }),
      });
      const reader = response.body!.getReader();
      let text = Buffer.from((await reader.read()).value!).toString();
      // Wrapped: an async function returning a promise would wait for it.
      const rest = (async () => {
        try {
          for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += Buffer.from(chunk.value).toString();
        } catch {
          // cut short: what arrived is the answer
        }
        return text;
      })();
      return { rest };
    };
    // 2 s and 40 s of tokens: the short one drains, the long one is still running at the third.
    const [{ rest: short }, { rest: long }] = await Promise.all([stream(20), stream(400)]);
    await interruptGroup();
    await printed(/SIGINT: draining in-flight requests/);
    await interruptGroup();
    await printed(/SIGINT again: still draining in-flight requests \(a third signal forces an exit\)/);
    expect((await short).trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(out).not.toMatch(/forcing/);
    await interruptGroup();
    await done;
    expect(out).toMatch(/SIGINT: forcing an exit, in-flight requests are cut/);
    expect(await long).not.toContain('data: [DONE]');
  });

  it('logs JSON lines off a terminal, one access line per request with its rank, and exports traces with --otlp-endpoint', async () => {
    const exported: string[] = [];
    let received!: () => void;
    const someExported = new Promise<void>((resolve) => (received = resolve));
    const collector = await serve((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (chunk: Buffer) => chunks.push(chunk));
      req.on('end', () => {
        if (req.url === '/v1/traces') exported.push(Buffer.concat(chunks).toString('utf8'));
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{}');
        received();
      });
    });
    try {
      const child = run(['--port', '0', '--otlp-endpoint', collector.url, '--log-level', 'debug']);
      const done = exited(child);
      const url = await new Promise<string>((resolve) => {
        child.stdout.on('data', (chunk: Buffer) => {
          const match = /listening on (http:\/\/127\.0\.0\.1:\d+) → embedded mock vLLM/.exec(chunk.toString());
          if (match) resolve(match[1]);
        });
      });
      const response = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock-model', prompt: 'hi', max_tokens: 2 }),
      });
      expect(response.status).toBe(200);
      await response.arrayBuffer();
      child.kill('SIGTERM');
      const { code, stdout } = await done;
      expect(code).toBe(0);
      const lines = stdout.trim().split('\n').map((line) => JSON.parse(line) as Record<string, unknown>);
      expect(lines.find((line) => line.msg === 'express-dp-router: routed')).toMatchObject({ level: 20, dpRank: { upstream: 'mock-vllm', source: 'assigned' } });
      expect(lines.find((line) => line.msg === 'request completed')).toMatchObject({ dpRank: { upstream: 'mock-vllm', source: 'assigned' }, res: { statusCode: 200 } });
      // Shutdown flushes the batch.
      await someExported;
      // OTLP/JSON: the decision on the HTTP server span (kind 2), none on Express's spans.
      type OtlpSpan = { kind: number; name: string; attributes: Array<{ key: string }> };
      type OtlpExport = { resourceSpans: Array<{ resource: { attributes: Array<{ key: string; value: { stringValue?: string } }> }; scopeSpans: Array<{ spans: OtlpSpan[] }> }> };
      const batches = exported.map((text) => JSON.parse(text) as OtlpExport).flatMap((batch) => batch.resourceSpans);
      const spans = batches.flatMap((batch) => batch.scopeSpans.flatMap((scope) => scope.spans));
      const decided = spans.filter((span) => span.attributes.some((attribute) => attribute.key === 'dp_router.rank'));
      expect(decided.map((span) => span.kind)).toEqual([2]);
      // Express is instrumented (so the decision is on the server span by choice, not for want of
      // other spans): a span per middleware, `middleware - <name>` (`request handler` for routes).
      expect(spans.some((span) => span.kind === 1 && /^(middleware|request handler)\b/.test(span.name))).toBe(true);
      expect(new Set(batches.map((batch) => batch.resource.attributes.find((attribute) => attribute.key === 'service.name')?.value.stringValue))).toEqual(
        new Set(['express-dp-router-gateway']),
      );
    } finally {
      await collector.close();
    }
  });
  it('routes on the embedded mock\'s KV events with --policy prefix-aware and no other flag', async () => {
    const child = run(['--port', '0', '--policy', 'prefix-aware', '--expose-decision']);
    const done = exited(child);
    try {
      const url = await new Promise<string>((resolve) => {
        child.stdout.on('data', (chunk: Buffer) => {
          const match = /listening on (http:\/\/127\.0\.0\.1:\d+) → embedded mock vLLM .*policy prefix-aware \(exact, on KV events\)/.exec(chunk.toString());
          if (match) resolve(match[1]);
        });
      });
      const ask = async (question: string) => {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'system', content: 'You are a helpful assistant. '.repeat(20) }, { role: 'user', content: question }], max_tokens: 1 }),
        });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        return res.headers.get('x-dp-router-decision') ?? '';
      };
      // The rank's first batch of events makes its stream fresh; until then it is routed approximately.
      const decisions: string[] = [];
      await waitFor(async () => {
        decisions.push(await ask(`question ${decisions.length}`));
        return decisions[decisions.length - 1].endsWith('; index=exact');
      }, 10_000, () => `no exact decision in ${JSON.stringify(decisions)}`, 50);
      expect(decisions[decisions.length - 1]).toMatch(/^upstream=mock-vllm; rank=\d; source=assigned; index=exact$/);
      const metrics = await (await fetch(`${url}/metrics`)).text();
      expect(metrics).toMatch(/dp_router_kv_stream_fresh\{upstream="mock-vllm",rank="\d"\} 1/);
    } finally {
      child.kill('SIGTERM');
      expect((await done).code).toBe(0);
    }
  });
});

describe("the embedded mock's port", () => {
  it('is --mock-port when given', async () => {
    const port = await freePort();
    const gateway = await startExampleGateway(parseCommandLine(['--port', '0', '--mock-port', String(port)]) as GatewaySettings);
    try {
      expect(gateway.mock!.port).toBe(port);
      expect(gateway.summary).toContain(`embedded mock vLLM http://127.0.0.1:${port} `);
    } finally {
      await gateway.close();
    }
  });

  it('is the default port when free; taken, it is an error naming --mock-port, never a silent move prometheus.yml would not follow', async () => {
    const port = await freePort();
    const first = await startMockOnPort(undefined, {}, port);
    try {
      expect(first.port).toBe(port);
      await expect(startMockOnPort(undefined, {}, port)).rejects.toThrow(
        `the embedded mock vLLM, where example-server/prometheus.yml scrapes it, cannot listen on 127.0.0.1:${port}: another process holds that port (EADDRINUSE); give --mock-port N (0: any free port; prometheus.yml's vllm job then needs that port)`,
      );
      await expect(startMockOnPort(port, {})).rejects.toThrow(`the embedded mock vLLM cannot listen on 127.0.0.1:${port}: another process holds that port (EADDRINUSE); give --mock-port N`);
    } finally {
      await first.close();
    }
  });

  it('is any free port when the gateway is on any port (--port 0)', async () => {
    const gateway = await startExampleGateway(parseCommandLine(['--port', '0']) as GatewaySettings);
    try {
      expect((await fetch(`${gateway.mock!.url}/health`)).status).toBe(200);
    } finally {
      await gateway.close();
    }
  });
});

describe('the start-up line', () => {
  it('says what admission, its Redis and the peers are, never a password or the peers\' secret', async () => {
    const lines: string[] = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => void lines.push(line) });
    const [listen, other] = [await freeUdpPort(), await freeUdpPort()];
    const argv = ['--port', '0', '--max-inflight-per-rank', '2', '--tenant-header', 'X-Tenant-Id', '--tokens-per-minute', '5000', '--redis', 'redis://:s3cret-pw@127.0.0.1:9'];
    const peers = ['--peer-listen', `127.0.0.1:${listen}`, '--peer', `127.0.0.1:${other}`];
    const secret = 'a peers secret nobody may read';
    const gateway = await startExampleGateway(parseCommandLine([...argv, ...peers], { DP_ROUTER_PEER_SECRET: secret }) as GatewaySettings, logger);
    try {
      expect(gateway.summary).toContain(
        '; admission: 2 in flight per rank, then a queue of 1024 (30000 ms at most), tenants by x-tenant-id, 5000 tokens per minute per tenant counted in Redis redis://***@127.0.0.1:9',
      );
      expect(gateway.summary).toContain(`; peers: UDP 127.0.0.1:${listen} with 1 replica address(es); metrics at`);
      expect(gateway.summary).not.toMatch(/s3cret|nobody may read/);
    } finally {
      await gateway.close();
    }
    const plain = await startExampleGateway(parseCommandLine(['--port', '0', '--queue-max', '10']) as GatewaySettings);
    try {
      expect(plain.summary).toContain('; admission: 32 in flight per rank, then a queue of 10 (30000 ms at most), one tenant; metrics at');
      expect(plain.summary).not.toContain('peers');
    } finally {
      await plain.close();
    }
  });
});

describe('--rank-header with the embedded mock', () => {
  it('48.11: --rank-header none reaches the mock, which balances its engines itself, and route receipts say the header is not honoured', async () => {
    const lines: string[] = [];
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
    const gateway = await startExampleGateway(parseCommandLine(['--port', '0', '--policy', 'prefix-aware', '--rank-header', 'none']) as GatewaySettings, logger);
    try {
      expect(gateway.summary).toContain('ranks 0-3 (no rank header)');
      const unhonoured = () => lines.find((line) => line.includes("upstream 'mock-vllm' does not honour the rank header"));
      // Prompts of their own (new blocks each), as many as receipts need for a verdict, from
      // three clients (API keys): a verdict for everyone needs verdicts.minSources (3) sources.
      for (let index = 0; index < 40 && unhonoured() === undefined; index++) {
        const response = await fetch(`${gateway.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer client-${index % 3}` },
          body: JSON.stringify({ model: 'mock-model', prompt: `request ${index}: ${'a distinct prompt that fills several blocks '.repeat(8)}`, max_tokens: 2 }),
        });
        expect(response.status).toBe(200);
        await response.arrayBuffer();
      }
      await waitFor(() => unhonoured() !== undefined, 10_000, () => `no verdict in ${lines.length} lines`);
      expect(JSON.parse(unhonoured()!)).toMatchObject({ level: 50, msg: expect.stringContaining("`rankHeader: 'none'` sends no rank header") });
      const generations = gateway.mock!.stats().requests.filter((record) => record.path === '/v1/completions');
      expect(generations.length).toBeGreaterThan(0);
      expect(generations.every((record) => record.rankHeaders.length === 0)).toBe(true);
    } finally {
      await gateway.close();
    }
  });
});

describe('discovery with --model and --discover', () => {
  it('48.16: logs at info, naming /v1/models only for what the server listed and the configuration for --model', async () => {
    const lines: Array<{ level: number; msg: string }> = [];
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line) as { level: number; msg: string }) });
    const mock = await startMockVllm({ dataParallelSize: 4, port: 0 });
    // Eight ranks configured, four served: discovery narrows to what the server runs.
    const settings = parseCommandLine(['--port', '0', '--upstream', mock.url, '--model', 'configured-model', '--discover', '--dp-size', '8']) as GatewaySettings;
    const gateway = await startExampleGateway(settings, logger);
    try {
      const news = () => lines.filter((line) => / by its \/(v1\/models|metrics)\b/.test(line.msg));
      await waitFor(() => news().length === 2, 10_000, () => JSON.stringify(lines));
      expect(news().sort((a, b) => a.msg.localeCompare(b.msg))).toEqual([
        { level: 30, msg: `express-dp-router: upstream '${mock.url}' serves mock-model by its /v1/models and configured-model by its configuration; routing those models to it.`, time: expect.any(Number), pid: expect.any(Number), hostname: expect.any(String) },
        expect.objectContaining({ level: 30, msg: `express-dp-router: upstream '${mock.url}' serves ranks 0, 1, 2, 3 by its /metrics (was: 0, 1, 2, 3, 4, 5, 6, 7); routing to those now.` }),
      ]);
    } finally {
      await gateway.close();
      await mock.close();
    }
  });
});

describe('--peer-redis', () => {
  it('48.4: takes the Redis URL from DP_ROUTER_REDIS_URL, announces on its channel, and the start-up line says Redis, never the password', async () => {
    const redis = await startRedis(undefined, ['--requirepass', 'redis-pw-s3cret']);
    const { default: Redis } = await import('ioredis');
    const listener = new Redis(`redis://:redis-pw-s3cret@127.0.0.1:${redis.port}`);
    try {
      const heard = new Promise<string>((resolve) => listener.on('message', (channel: string) => resolve(channel)));
      await listener.subscribe('dp-router:peers');
      const env = { DP_ROUTER_REDIS_URL: `redis://:redis-pw-s3cret@127.0.0.1:${redis.port}`, DP_ROUTER_PEER_SECRET: 'a secret of the replicas' };
      const settings = parseCommandLine(['--port', '0', '--peer-redis'], env) as GatewaySettings;
      const gateway = await startExampleGateway(settings);
      try {
        expect(gateway.summary).toContain(`; peers: Redis pub/sub on redis://***@127.0.0.1:${redis.port}, channel dp-router:peers; metrics at`);
        expect(gateway.summary).not.toMatch(/UDP|s3cret|undefined/);
        // The replica's heartbeat, published with the password from the environment.
        expect(await heard).toBe('dp-router:peers');
        // Only what uses Redis reads the variable: it turns no admission on.
        expect(settings.admission).toEqual({ redisUrl: env.DP_ROUTER_REDIS_URL });
        expect(gateway.summary).not.toContain('admission');
      } finally {
        await gateway.close();
      }
    } finally {
      listener.disconnect();
      await redis.stop();
    }
  });
});

describe("the gateway's own port", () => {
  it('taken, is an error naming the gateway, its address and the flag or variable that moves it', async () => {
    const holder = await serve(() => undefined);
    const port = Number(new URL(holder.url).port);
    try {
      const settings = parseCommandLine(['--port', String(port), '--upstream', 'http://127.0.0.1:9']) as GatewaySettings;
      await expect(startExampleGateway(settings)).rejects.toThrow(
        `the gateway cannot listen on 127.0.0.1:${port}: another process holds that port (EADDRINUSE); give --port N or set PORT (0: any free port)`,
      );
    } finally {
      await holder.close();
    }
  });
});

describe("the example gateway's access log", () => {
  it('48.1: writes no Authorization, Proxy-Authorization, Cookie, x-api-key or Set-Cookie value, only that the header was there', async () => {
    const lines: string[] = [];
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
    // An upstream that sets a session cookie, as a login proxy in front of vLLM may.
    const upstream = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'set-cookie': 'session=cookie-from-upstream-s3cret; HttpOnly' });
      res.end('{"choices":[]}');
    });
    const gateway = await startExampleGateway(parseCommandLine(['--port', '0', '--upstream', upstream.url, '--dp-size', '1']) as GatewaySettings, logger);
    try {
      const response = await fetch(`${gateway.url}/v1/completions`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          authorization: 'Bearer sk-vllm-api-key-s3cret',
          'proxy-authorization': 'Basic cHJveHk6czNjcmV0',
          cookie: 'session=client-cookie-s3cret',
          'x-api-key': 'x-api-key-s3cret',
          'x-tenant-id': 'team-a',
        },
        body: '{"model":"m","prompt":"hi"}',
      });
      expect(response.status).toBe(200);
      expect(response.headers.get('set-cookie')).toContain('cookie-from-upstream-s3cret');
      await response.arrayBuffer();
      await waitFor(() => lines.some((line) => line.includes('"res":')));
      const access = JSON.parse(lines.find((line) => line.includes('"res":'))!) as { req: { headers: Record<string, string> }; res: { headers: Record<string, string> } };
      expect(lines.join('\n')).not.toMatch(/s3cret|cHJveHk6czNjcmV0/);
      expect(access.req.headers).toMatchObject({ authorization: '[Redacted]', 'proxy-authorization': '[Redacted]', cookie: '[Redacted]', 'x-api-key': '[Redacted]', 'x-tenant-id': 'team-a' });
      expect(access.res.headers['set-cookie']).toBe('[Redacted]');
    } finally {
      await gateway.close();
      await upstream.close();
    }
  });

  it('logs a gateway 502 with the vLLM error it answered, not a stack', async () => {
    const lines: Array<Record<string, unknown>> = [];
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    // A port nothing listens on (below the ephemeral range: no other test's listen(0) takes it): the connection is refused.
    const refused = `http://127.0.0.1:${await freePort()}`;
    const settings = parseCommandLine(['--port', '0', '--upstream', refused, '--dp-size', '1']) as GatewaySettings;
    const gateway = await startExampleGateway(settings, logger);
    try {
      const response = await fetch(`${gateway.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"prompt":"hi"}' });
      expect(response.status).toBe(502);
      await response.arrayBuffer();
      await waitFor(() => lines.some((line) => line.res !== undefined));
      const access = lines.find((line) => line.res !== undefined)!;
      expect(access).toMatchObject({
        msg: 'BadGatewayError: The upstream for data-parallel rank 0 refused the connection.',
        error: { type: 'BadGatewayError', message: 'The upstream for data-parallel rank 0 refused the connection.' },
        res: { statusCode: 502 },
      });
      expect(access).not.toHaveProperty('err');
      expect(JSON.stringify(access)).not.toMatch(/stack|failed with status code/);
    } finally {
      await gateway.close();
    }
  });
});
