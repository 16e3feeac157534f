import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { request as httpRequest, Agent } from 'node:http';
import { join } from 'node:path';
import { startMockVllm } from '../../example-server/mock-vllm';
import { exponential, seededRng } from '../routing/rng';
import { freeUdpPort } from '../lib/udp-port';

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
  /** 1: the gateways announce their in-flight counts to each other (`--peer-listen`, `--peer`). */
  peers: number;
  decodeMsPerToken: number;
  seed: number;
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

/** Starts a gateway process (the example server) and resolves with its URL. */
function startGatewayProcess(args: string[]): Promise<{ url: string; child: ChildProcessWithoutNullStreams }> {
  const env = { ...process.env, DP_ROUTER_PEER_SECRET: 'bench:gateways peers on loopback' };
  const child = spawn(join(ROOT, 'node_modules', '.bin', 'tsx'), [join(ROOT, 'example-server', 'main.ts'), '--port', '0', ...args], { cwd: ROOT, env });
  return new Promise((resolve, reject) => {
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      const match = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(output);
      if (match) resolve({ url: match[1], child });
    });
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('exit', (code) => reject(new Error(`gateway exited with ${code}: ${output}`)));
    // A process that never listens (seen once: tsx's loader stuck at start) fails the run
    // instead of holding the benchmark forever.
    setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`gateway did not listen within ${START_TIMEOUT_MS} ms: ${output}`));
    }, START_TIMEOUT_MS).unref();
  });
}

/** Runs one configuration and measures how evenly the engines were loaded. */
export async function runFleet(options: FleetOptions): Promise<FleetResult> {
  const mock = await startMockVllm({ dataParallelSize: options.ranks, decodeMsPerToken: options.decodeMsPerToken });
  const args = ['--upstream', `${mock.url}@0-${options.ranks - 1}`, '--policy', 'least-outstanding', '--trust-hints'];
  if (options.feedbackMs > 0) args.push('--load-feedback-ms', String(options.feedbackMs), '--load-feedback-weight', String(options.feedbackWeight));
  const peers = options.peers > 0 ? await peerArgs(options.gateways) : [];
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
    const body = JSON.stringify({ model: 'mock-model', prompt: 'How balanced is the fleet?', max_tokens: maxTokens });
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
  const sampler = setInterval(() => {
    if (Date.now() - started < WARMUP_MS) return;
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

  const served = Object.values(mock.stats().perRank).map((rank) => rank.requests);
  const total = served.reduce((sum, value) => sum + value, 0);
  const meanRunning = runningSum.reduce((sum, value) => sum + value, 0) / runningSum.length;
  agent.destroy();
  for (const { child } of gateways) child.kill('SIGTERM');
  await Promise.all(gateways.map(({ child }) => new Promise((resolve) => (child.exitCode === null ? child.once('exit', resolve) : resolve(undefined)))));
  await mock.close();
  return {
    averagedMaxOverMean: meanRunning > 0 ? Math.max(...runningSum) / meanRunning : 1,
    instantMaxOverMean: samples > 0 ? instantSum / samples : 1,
    shares: served.map((value) => value / total),
    requests,
    errors,
  };
}
