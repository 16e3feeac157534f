import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { request as httpRequest, Agent } from 'node:http';
import { join } from 'node:path';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { exponential, seededRng } from '../routing/rng';
import { freePort, freeUdpPort } from '../lib/ports';
import { startBenchRedis, type BenchRedis } from '../lib/redis-server';

/** How the gateways learn each other's load: not at all, UDP datagrams, or a Redis channel. */
export type PeersMode = 'off' | 'udp' | 'redis';
/** The gateways' policy: least-outstanding, or prefix-aware on the mock's KV events (exact routing). */
export type FleetPolicy = 'least-outstanding' | 'exact';

/** One measured run: several gateway processes in front of one mock vLLM. */
export interface FleetOptions {
  gateways: number;
  ranks: number;
  /** Requests per second over all gateways (Poisson arrivals). */
  rate: number;
  seconds: number;
  /** 0: local in-flight counts only. */
  feedbackMs: number;
  feedbackWeight: number;
  /** Share of the first gateway's requests its clients pin to rank 0 with a trusted hint. */
  pinnedShare: number;
  /** The gateways announce their in-flight counts to each other over UDP (`--peer-listen`, `--peer`) or Redis (`--redis`, `--peer-redis`). */
  peers: PeersMode;
  policy: FleetPolicy;
  decodeMsPerToken: number;
  seed: number;
}

/** One gateway process's figures over the measured window (after the warm-up), from its lag probe. */
export interface GatewayFigures {
  /** Event-loop delay percentiles, ms. */
  lagP50Ms: number;
  lagP99Ms: number;
  cpuMs: number;
}

export interface FleetResult {
  /** max/mean of each rank's running requests averaged over the run. */
  averagedMaxOverMean: number;
  /** The same, sample by sample, then averaged: how uneven the engines are at any instant. */
  instantMaxOverMean: number;
  /** Share of all requests each rank served. */
  shares: number[];
  requests: number;
  errors: number;
  /** The gateways' CPU (all three summed, `process.cpuUsage`) per request sent after the warm-up, µs. */
  cpuUsPerRequest: number;
  /** The worst gateway's event-loop delay p99 after the warm-up, ms. */
  lagP99Ms: number;
  gateways: GatewayFigures[];
}

const ROOT = join(__dirname, '..', '..');
const WARMUP_MS = 1_000;
const START_TIMEOUT_MS = 30_000;
const SAMPLE_MS = 25;

/** `--peer-listen` and `--peer` for each of `count` gateways on loopback, every one listing all. */
async function peerArgs(count: number): Promise<string[][]> {
  const addresses: string[] = [];
  for (let i = 0; i < count; i++) addresses.push(`127.0.0.1:${await freeUdpPort()}`);
  return addresses.map((listen) => ['--peer-listen', listen, ...addresses.flatMap((address) => ['--peer', address])]);
}

/** A gateway process: its URL, and its lag probe (bench/gateways/lag-probe.ts) read by signal. */
interface GatewayProcess {
  url: string;
  child: ChildProcessWithoutNullStreams;
  /** The probe's figures since the last call (the first call starts the window). */
  probe(): Promise<{ p50: number; p99: number; cpuUs: number }>;
}

/** Every gateway process still running: killed if this process ends first (an error, Ctrl-C). */
const running = new Set<ChildProcessWithoutNullStreams>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

/**
 * Starts a gateway process (the example server, with the lag probe preloaded) and resolves
 * with its URL once `/healthz` answers. Node runs it directly (no tsx wrapper process), so the
 * figures are the gateway's; at log level `warn`, so that no access line per request is paid.
 */
async function startGatewayProcess(args: string[]): Promise<GatewayProcess> {
  const env = { ...process.env, DP_ROUTER_PEER_SECRET: 'bench:gateways peers on loopback' };
  // Below the ephemeral range: no other process's listen(0) takes it before the gateway binds it.
  const port = await freePort();
  const node = ['--disable-warning=DEP0060', '--import', 'tsx', '--import', join(__dirname, 'lag-probe.ts'), join(ROOT, 'example-server', 'main.ts')];
  const child = spawn(process.execPath, [...node, '--port', String(port), '--log-level', 'warn', ...args], { cwd: ROOT, env });
  running.add(child);
  child.once('exit', () => running.delete(child));
  const probes: Array<(line: string) => void> = [];
  let output = '';
  let pending = '';
  // A gateway that dies mid-run fails the run, naming why, instead of leaving its probe unanswered.
  const died = new Promise<never>((_, reject) => child.once('exit', (code, signal) => reject(new Error(`gateway on port ${port} exited (${code ?? signal}) during the run: ${output}`))));
  died.catch(() => undefined);
  const probe = () =>
    Promise.race([
      new Promise<{ p50: number; p99: number; cpuUs: number }>((resolve) => {
        probes.push((line) => resolve(JSON.parse(line) as { p50: number; p99: number; cpuUs: number }));
        child.kill('SIGUSR2');
      }),
      died,
    ]);
  child.stdout.on('data', (chunk: Buffer) => {
    pending += chunk.toString();
    for (let newline = pending.indexOf('\n'); newline !== -1; newline = pending.indexOf('\n')) {
      const line = pending.slice(0, newline);
      pending = pending.slice(newline + 1);
      if (line.startsWith('PROBE ')) probes.shift()?.(line.slice('PROBE '.length));
      else output += `${line}\n`;
    }
  });
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const url = `http://127.0.0.1:${port}`;
  // A process that never listens (seen once: tsx's loader stuck at start) fails the run
  // instead of holding the benchmark forever.
  const deadline = Date.now() + START_TIMEOUT_MS;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`gateway exited with ${child.exitCode}: ${output}`);
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`gateway did not listen within ${START_TIMEOUT_MS} ms: ${output}`);
    }
    // Bounded, so that the loop goes on checking the child's exit whatever holds the port.
    const healthy = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2_000) }).then((answer) => answer.ok, () => false);
    if (healthy) return { url, child, probe };
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/**
 * The mock vLLM; with exact routing it publishes KV events on ports in vLLM's scheme (rank r
 * on base + r), which the gateways' `--kv-events` names by rank 0's, at a random base (tried
 * again when taken).
 */
async function startMock(options: FleetOptions): Promise<{ mock: MockVllm; args: string[] }> {
  const base = { dataParallelSize: options.ranks, decodeMsPerToken: options.decodeMsPerToken };
  if (options.policy === 'least-outstanding') return { mock: await startMockVllm(base), args: ['--policy', 'least-outstanding'] };
  for (let attempt = 0; ; attempt++) {
    const port = 20_000 + 16 * Math.floor(Math.random() * 2_000);
    try {
      const mock = await startMockVllm({ ...base, kvEvents: { port, replayPort: port + options.ranks } });
      const events = mock.kvEvents!;
      return { mock, args: ['--policy', 'prefix-aware', '--placement-slack', '0', '--kv-events', `tcp://127.0.0.1:${port},tcp://127.0.0.1:${port + options.ranks}`, '--tokenizer', events.tokenizer] };
    } catch (error) {
      if (attempt >= 5) throw error;
    }
  }
}

/** What the gateways are started with for `mode`: nothing, each one's UDP flags, or the Redis flags. */
async function peersArgs(mode: PeersMode, count: number, redis: BenchRedis | undefined): Promise<string[][]> {
  if (mode === 'udp') return peerArgs(count);
  if (mode === 'redis') return Array.from({ length: count }, () => ['--redis', redis!.url, '--peer-redis']);
  return [];
}

/** Prompts for exact routing: a few system prompts shared by many requests, each with its own question. */
const SYSTEM_PROMPTS = Array.from({ length: 12 }, (_, at) => `You are assistant number ${at}. `.repeat(40));

/** Runs one configuration and measures how evenly the engines were loaded, and what the gateways spent. */
export async function runFleet(options: FleetOptions): Promise<FleetResult> {
  const { mock, args: policyArgs } = await startMock(options);
  const args = ['--upstream', `${mock.url}@0-${options.ranks - 1}`, ...policyArgs, '--trust-hints'];
  if (options.feedbackMs > 0) args.push('--load-feedback-ms', String(options.feedbackMs), '--load-feedback-weight', String(options.feedbackWeight));
  const redis = options.peers === 'redis' ? await startBenchRedis() : undefined;
  const peers = await peersArgs(options.peers, options.gateways, redis);
  const gateways = await Promise.all(Array.from({ length: options.gateways }, (_, i) => startGatewayProcess([...args, ...(peers[i] ?? [])])));
  const agent = new Agent({ keepAlive: true, maxSockets: 512 });
  const random = seededRng(options.seed);
  const runningSum = new Array<number>(options.ranks).fill(0);
  let instantSum = 0;
  let samples = 0;
  let requests = 0;
  let errors = 0;
  const pending = new Set<Promise<void>>();

  const send = (gateway: string, pinned: boolean, maxTokens: number) => {
    const prompt = options.policy === 'exact' ? `${SYSTEM_PROMPTS[Math.floor(random() * SYSTEM_PROMPTS.length)]}Question ${requests}: how balanced is the fleet?` : 'How balanced is the fleet?';
    const body = JSON.stringify({ model: 'mock-model', prompt, max_tokens: maxTokens });
    const headers: Record<string, string | number> = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) };
    if (pinned) headers['x-data-parallel-rank'] = '0';
    const done = new Promise<void>((resolve) => {
      const outgoing = httpRequest(`${gateway}/v1/completions`, { method: 'POST', headers, agent }, (response) => {
        if (response.statusCode !== 200) errors++;
        response.resume();
        response.on('end', resolve);
        response.on('error', () => resolve());
      });
      outgoing.on('error', () => {
        errors++;
        resolve();
      });
      outgoing.end(body);
    });
    requests++;
    pending.add(done);
    done.finally(() => pending.delete(done));
  };

  const started = Date.now();
  let measured: Promise<unknown> | undefined;
  let requestsAtWarm = 0;
  const sampler = setInterval(() => {
    if (Date.now() - started < WARMUP_MS) return;
    if (measured === undefined) {
      requestsAtWarm = requests;
      measured = Promise.all(gateways.map((gateway) => gateway.probe()));
    }
    const running = Object.values(mock.stats().perRank).map((rank) => rank.running);
    const mean = running.reduce((sum, value) => sum + value, 0) / running.length;
    running.forEach((value, rank) => (runningSum[rank] += value));
    if (mean > 0) {
      instantSum += Math.max(...running) / mean;
      samples++;
    }
  }, SAMPLE_MS);

  // Open loop: arrivals do not wait for answers, as independent clients do not.
  const deadline = started + options.seconds * 1000;
  let next = started;
  let index = 0;
  while (next < deadline) {
    next += exponential(random, 1000 / options.rate);
    const wait = next - Date.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    const gateway = index++ % options.gateways;
    // Output lengths vary widely, as chat answers do: 1 to about 200 tokens, most short.
    const maxTokens = Math.min(200, 1 + Math.floor(Math.exp(random() * 5.3)));
    send(gateways[gateway].url, gateway === 0 && random() < options.pinnedShare, maxTokens);
  }
  clearInterval(sampler);
  await Promise.all(pending);
  const before = (await measured) as Array<{ cpuUs: number }> | undefined;
  const after = await Promise.all(gateways.map((gateway) => gateway.probe()));
  const figures: GatewayFigures[] = after.map((probe, at) => ({ lagP50Ms: probe.p50, lagP99Ms: probe.p99, cpuMs: (probe.cpuUs - (before?.[at].cpuUs ?? 0)) / 1000 }));
  const measuredRequests = requests - requestsAtWarm;

  const served = Object.values(mock.stats().perRank).map((rank) => rank.requests);
  const total = served.reduce((sum, value) => sum + value, 0);
  const meanRunning = runningSum.reduce((sum, value) => sum + value, 0) / runningSum.length;
  agent.destroy();
  for (const { child } of gateways) child.kill('SIGTERM');
  await Promise.all(gateways.map(({ child }) => new Promise((resolve) => (child.exitCode === null ? child.once('exit', resolve) : resolve(undefined)))));
  await mock.close();
  await redis?.stop();
  return {
    averagedMaxOverMean: meanRunning > 0 ? Math.max(...runningSum) / meanRunning : 1,
    instantMaxOverMean: samples > 0 ? instantSum / samples : 1,
    shares: served.map((value) => value / total),
    requests,
    errors,
    cpuUsPerRequest: (figures.reduce((sum, gateway) => sum + gateway.cpuMs, 0) * 1000) / Math.max(1, measuredRequests),
    lagP99Ms: Math.max(...figures.map((gateway) => gateway.lagP99Ms)),
    gateways: figures,
  };
}
