/**
 * The operator kit against a real Prometheus: the shipped scrape config (example-server/
 * prometheus.yml) scrapes a running example gateway, PromQL by rank sees exactly the requests
 * sent, and every query of the Grafana dashboard evaluates to series. Needs Debian's
 * `prometheus` package (.ci/run installs it); skips, loudly, only when a binary is missing.
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { networkInterfaces, tmpdir } from 'node:os';
import path from 'node:path';
import { parse, stringify } from 'yaml';
import { DEFAULT_MOCK_PORT, parseCommandLine, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway, type RunningGateway } from '../../example-server/gateway';
import {
  dashboardQueries,
  findExecutable,
  freePort,
  queryInstant,
  REPO,
  startPrometheus,
  waitFor,
  withoutGrafanaVariables,
  type RunningPrometheus,
} from '../helpers';

const PROMETHEUS = findExecutable('prometheus');
const PROMTOOL = findExecutable('promtool');
const CONFIG_FILE = path.join(REPO, 'example-server', 'prometheus.yml');
const JOB = 'express-dp-router';

/** Requests pinned to each global rank with trusted hints; rank 2 gets none and must read 0. */
const HINTED: Record<string, number> = { '0': 3, '1': 1, '2': 0, '3': 5 };
/** Then 3 requests without a hint and 1 with a malformed one: round-robin gives each rank one. */
const UNHINTED = 3;
const MALFORMED = 1;
const HINTED_TOTAL = Object.values(HINTED).reduce((sum, count) => sum + count, 0);
const TOTAL = HINTED_TOTAL + UNHINTED + MALFORMED;

function skipped(binary: string): boolean {
  console.warn(`SKIPPED: ${binary} was not found on PATH or in /usr/bin, so this Prometheus test did not run. Install Debian's \`prometheus\` package (as .ci/run does).`);
  return true;
}

function chat(gateway: RunningGateway, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 }),
  });
}

/** The shipped config with the gateway and the embedded mock vLLM as targets and a 1 s scrape interval. */
function testConfig(target: string, vllmTarget: string): string {
  const config = parse(readFileSync(CONFIG_FILE, 'utf8'));
  const job = config.scrape_configs.find((candidate: { job_name: string }) => candidate.job_name === JOB);
  if (!job) throw new Error(`${CONFIG_FILE} has no job ${JOB}`);
  delete job.scrape_interval;
  delete job.scrape_timeout;
  job.static_configs = [{ targets: [target] }];
  const vllm = { job_name: 'vllm', metrics_path: '/metrics', static_configs: [{ targets: [vllmTarget] }] };
  return stringify({ ...config, global: { ...config.global, scrape_interval: '1s' }, scrape_configs: [job, vllm] });
}

describe('example-server/prometheus.yml', () => {
  it('passes promtool check config', () => {
    if (!PROMTOOL) return void skipped('promtool');
    const shipped = spawnSync(PROMTOOL, ['check', 'config', CONFIG_FILE], { encoding: 'utf8' });
    expect(shipped.stdout + shipped.stderr).toContain('SUCCESS');
    expect(shipped.status).toBe(0);
  });

  it('scrapes the gateway and its embedded mock vLLM at their default ports', () => {
    const config = parse(readFileSync(CONFIG_FILE, 'utf8')) as { scrape_configs: Array<{ job_name: string; static_configs: Array<{ targets: string[] }> }> };
    const targets = Object.fromEntries(config.scrape_configs.map((job) => [job.job_name, job.static_configs.flatMap((group) => group.targets)]));
    const defaults = parseCommandLine([]) as GatewaySettings;
    expect(defaults.mockPort).toBeUndefined();
    expect(targets).toEqual({ [JOB]: [`127.0.0.1:${defaults.port}`], vllm: [`127.0.0.1:${DEFAULT_MOCK_PORT}`] });
  });
});

/** Every documented command line that starts Prometheus on the shipped config, with where it is written. */
function documentedRecipes(): Array<{ where: string; command: string }> {
  const recipes: Array<{ where: string; command: string }> = [];
  const docs = readdirSync(path.join(REPO, 'docs')).filter((name) => name.endsWith('.md')).map((name) => `docs/${name}`);
  for (const file of ['README.md', 'example-server/prometheus.yml', ...docs]) {
    for (const line of readFileSync(path.join(REPO, file), 'utf8').split('\n')) {
      const found = /(?:^|[\s`#])(prometheus --config\.file=example-server\/prometheus\.yml[^`\n]*)/.exec(line);
      if (found) recipes.push({ where: file, command: found[1].trim() });
    }
  }
  return recipes;
}

describe('the documented Prometheus command', () => {
  it('is the same everywhere: on loopback only, its data outside the checkout', () => {
    const recipes = documentedRecipes();
    expect(recipes.map((recipe) => recipe.where)).toEqual(expect.arrayContaining(['docs/operating.md', 'example-server/prometheus.yml']));
    for (const { where, command } of recipes) {
      expect({ where, command }).toEqual({ where, command: recipes[0].command });
      expect({ where, loopback: /--web\.listen-address=127\.0\.0\.1:\d+(\s|$)/.test(command) }).toEqual({ where, loopback: true });
      expect({ where, storage: /--storage\.tsdb\.path="\$\{TMPDIR:-\/tmp\}\/[^"]+"/.test(command) }).toEqual({ where, storage: true });
    }
  });

  it('run as written from the checkout, writes nothing there and answers on loopback alone', async () => {
    if (!PROMETHEUS) return void skipped('prometheus');
    const [{ command }] = documentedRecipes();
    const port = await freePort();
    const tmp = mkdtempSync(path.join(tmpdir(), 'dp-router-recipe-'));
    const before = new Set(readdirSync(REPO));
    const child = spawn('bash', ['-c', `exec ${command.replace(/127\.0\.0\.1:\d+/, `127.0.0.1:${port}`)}`], {
      cwd: REPO,
      env: { ...process.env, TMPDIR: tmp, PATH: `${path.dirname(PROMETHEUS)}:${process.env.PATH ?? ''}` },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (log += chunk));
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    try {
      await waitFor(async () => child.exitCode === null && (await fetch(`http://127.0.0.1:${port}/-/ready`)).ok, 15_000, () => `prometheus did not become ready:\n${log}`, 100);
      expect([...readdirSync(REPO)].filter((name) => !before.has(name))).toEqual([]);
      expect(readdirSync(tmp).length).toBeGreaterThan(0);
      // Any other address of this machine is refused (when it has one).
      for (const address of Object.values(networkInterfaces()).flat()) {
        if (address === undefined || address.internal || address.family !== 'IPv4') continue;
        await expect(fetch(`http://${address.address}:${port}/-/ready`)).rejects.toThrow();
      }
    } finally {
      child.kill('SIGTERM');
      await exited;
      rmSync(tmp, { recursive: true, force: true });
    }
  }, 30_000);
});

describe('a real Prometheus scraping the example gateway', () => {
  let gateway: RunningGateway;
  let prometheus: RunningPrometheus | undefined;

  beforeAll(async () => {
    const settings = parseCommandLine(['--port', '0', '--dp-size', '4', '--trust-hints', '--policy', 'round-robin', '--drain-timeout-ms', '1000']);
    if (settings === 'help') throw new Error('unexpected help');
    gateway = await startExampleGateway(settings);

    const answers: Response[] = [];
    for (const [rank, count] of Object.entries(HINTED)) {
      for (let sent = 0; sent < count; sent++) answers.push(await chat(gateway, { 'x-data-parallel-rank': rank }));
    }
    // One after another, so that round-robin hands each of the 4 ranks exactly one.
    for (let sent = 0; sent < UNHINTED; sent++) answers.push(await chat(gateway));
    for (let sent = 0; sent < MALFORMED; sent++) answers.push(await chat(gateway, { 'x-data-parallel-rank': '+1' }));
    await Promise.all(answers.map((answer) => answer.text()));
    expect(answers.map((answer) => answer.status)).toEqual(Array(TOTAL).fill(200));

    if (!PROMETHEUS) return;
    prometheus = await startPrometheus(PROMETHEUS, testConfig(new URL(gateway.url).host, new URL(gateway.mock!.url).host));
    // Every request counted, and enough 1 s scrapes since for rate() over 30 s.
    await waitFor(
      async () =>
        (await queryInstant(prometheus!.url, 'sum(dp_router_requests_total)'))[0]?.value === TOTAL &&
        ((await queryInstant(prometheus!.url, `count_over_time(up{job="${JOB}"}[30s])`))[0]?.value ?? 0) >= 4 &&
        ((await queryInstant(prometheus!.url, 'count_over_time(up{job="vllm"}[30s])'))[0]?.value ?? 0) >= 4,
      20_000,
      () => `Prometheus never saw ${TOTAL} requests from ${gateway.url}/metrics. Its log:\n${prometheus!.log()}`,
      100,
    );
  }, 30_000);

  afterAll(async () => {
    await prometheus?.close();
    await gateway?.close();
  });

  it('promtool check metrics finds no problem in the gateway /metrics', async () => {
    if (!PROMTOOL) return void skipped('promtool');
    const text = await (await fetch(`${gateway.url}/metrics`)).text();
    const result = spawnSync(PROMTOOL, ['check', 'metrics'], { input: text, encoding: 'utf8' });
    expect((result.stdout + result.stderr).trim()).toBe('');
    expect(result.status).toBe(0);
  });

  it('scrapes it with the shipped job', async () => {
    if (!prometheus) return void skipped('prometheus');
    const up = await queryInstant(prometheus.url, 'up');
    // Prometheus does not order an instant vector.
    expect(up).toHaveLength(2);
    expect(up).toEqual(
      expect.arrayContaining([
        { metric: { __name__: 'up', job: JOB, instance: new URL(gateway.url).host }, value: 1 },
        { metric: { __name__: 'up', job: 'vllm', instance: new URL(gateway.mock!.url).host }, value: 1 },
      ]),
    );
  });

  it('counts by rank exactly the requests sent to each rank', async () => {
    if (!prometheus) return void skipped('prometheus');
    const byRank = async (expr: string) => Object.fromEntries((await queryInstant(prometheus!.url, expr)).map((sample) => [sample.metric.rank, sample.value]));
    // Zero-initialised: rank 2 is there at 0 although no hint named it.
    expect(await byRank('sum by (rank) (dp_router_requests_total{source="hint"})')).toEqual(HINTED);
    // Round-robin gave each rank one of the 4 assigned requests; none went where vLLM picks the engine (rank "vllm").
    expect(await byRank('sum by (rank) (dp_router_requests_total)')).toEqual({
      ...Object.fromEntries(Object.entries(HINTED).map(([rank, count]) => [rank, count + 1])),
      vllm: 0,
    });
    expect(await byRank('sum by (rank) (dp_router_request_duration_seconds_count)')).toEqual(await byRank('sum by (rank) (dp_router_requests_total)'));
  });

  it('counts hint outcomes and rank sources', async () => {
    if (!prometheus) return void skipped('prometheus');
    const by = async (label: string, expr: string) => Object.fromEntries((await queryInstant(prometheus!.url, expr)).map((sample) => [sample.metric[label], sample.value]));
    expect(await by('outcome', 'sum by (outcome) (dp_router_rank_hints_total)')).toEqual({
      accepted: HINTED_TOTAL,
      malformed: MALFORMED,
      untrusted: 0,
      out_of_range: 0,
      unavailable: 0,
    });
    expect(await by('source', 'sum by (source) (dp_router_requests_total)')).toEqual({ hint: HINTED_TOTAL, assigned: UNHINTED + MALFORMED });
    expect(await by('rank', 'sum by (rank) (dp_router_endpoint_healthy)')).toEqual({ '0': 1, '1': 1, '2': 1, '3': 1 });
    expect((await queryInstant(prometheus!.url, 'sum(dp_router_upstream_errors_total)'))[0].value).toBe(0);
  });

  it('evaluates every Grafana dashboard query to series that carry the legend labels', async () => {
    if (!prometheus) return void skipped('prometheus');
    const queries = dashboardQueries();
    expect(queries.length).toBeGreaterThan(0);
    for (const query of queries) {
      const result = await queryInstant(prometheus.url, withoutGrafanaVariables(query.expr)).catch((error: Error) => {
        throw new Error(`${query.where}: ${error.message}`);
      });
      expect({ where: query.where, series: result.length > 0 }).toEqual({ where: query.where, series: true });
      const legendLabels = [...(query.legendFormat ?? '').matchAll(/\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}/g)].map((match) => match[1]);
      for (const sample of result) {
        expect({ where: query.where, missing: legendLabels.filter((label) => !(label in sample.metric)) }).toEqual({ where: query.where, missing: [] });
      }
    }
  });
});
