import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { freePort } from './ports';
import { waitFor } from './wait';

/** The repository root. */
export const REPO = path.resolve(__dirname, '..', '..');

/**
 * The absolute path of an executable on PATH (or in /usr/bin, where Debian's `prometheus`
 * package puts it), or `undefined`. Tests skip only when this is `undefined`, and say so.
 */
export function findExecutable(name: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(path.delimiter).filter(Boolean), '/usr/bin', '/usr/local/bin'];
  for (const dir of dirs) {
    const candidate = path.join(dir, name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** A Prometheus server started by a test. */
export interface RunningPrometheus {
  url: string;
  /** Everything it wrote to stderr so far (its log), for failure messages. */
  log(): string;
  /** Stops it (SIGTERM, then SIGKILL) and removes its storage. */
  close(): Promise<void>;
}

/** Starts `prometheus` on a free loopback port with this configuration and waits until it is ready. */
export async function startPrometheus(binary: string, config: string): Promise<RunningPrometheus> {
  const dir = mkdtempSync(path.join(tmpdir(), 'dp-router-prometheus-'));
  const configFile = path.join(dir, 'prometheus.yml');
  writeFileSync(configFile, config);
  const port = await freePort();
  const child = spawn(
    binary,
    [
      `--config.file=${configFile}`,
      `--storage.tsdb.path=${path.join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--log.level=warn',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (log += chunk));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const close = async () => {
    await stop(child, exited);
    rmSync(dir, { recursive: true, force: true });
  };
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitFor(async () => child.exitCode === null && (await fetch(`${url}/-/ready`)).ok, 15_000, () => `prometheus did not become ready:\n${log}`, 100);
  } catch (error) {
    await close();
    throw error;
  }
  return { url, log: () => log, close };
}

async function stop(child: ChildProcess, exited: Promise<void>): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const killed = setTimeout(() => child.kill('SIGKILL'), 5_000);
  await exited;
  clearTimeout(killed);
}

/** One series of an instant vector. */
export interface VectorSample {
  metric: Record<string, string>;
  value: number;
}

/** Runs an instant query through Prometheus' HTTP API; throws with Prometheus' own error message. */
export async function queryInstant(prometheusUrl: string, expr: string): Promise<VectorSample[]> {
  const response = await fetch(`${prometheusUrl}/api/v1/query?${new URLSearchParams({ query: expr })}`);
  const body = (await response.json()) as {
    status: string;
    error?: string;
    data?: { resultType: string; result: Array<{ metric: Record<string, string>; value: [number, string] }> };
  };
  if (body.status !== 'success') throw new Error(`query ${expr} failed: ${body.error}`);
  if (body.data!.resultType !== 'vector') throw new Error(`query ${expr} returned a ${body.data!.resultType}, not a vector`);
  return body.data!.result.map(({ metric, value }) => ({ metric, value: Number(value[1]) }));
}

/** One PromQL query of the Grafana dashboard. */
export interface DashboardQuery {
  /** Where it is, for messages: panel title and refId, or the variable name. */
  where: string;
  expr: string;
  legendFormat?: string;
}

/** The example Grafana dashboard, parsed. */
export function loadDashboard(): {
  panels: Array<{ id: number; type: string; title: string; datasource?: unknown; gridPos: { x: number; y: number; w: number; h: number }; targets?: Array<{ refId: string; expr: string; legendFormat?: string; datasource?: unknown }> }>;
  templating: { list: Array<{ name: string; type: string; query: unknown; definition?: string; datasource?: unknown }> };
  [key: string]: unknown;
} {
  return JSON.parse(readFileSync(path.join(REPO, 'example-server', 'grafana-dashboard.json'), 'utf8'));
}

/** Every panel target's PromQL expression. */
export function dashboardQueries(): DashboardQuery[] {
  return loadDashboard().panels.flatMap((panel) =>
    (panel.targets ?? []).map((target) => ({ where: `panel "${panel.title}" target ${target.refId}`, expr: target.expr, legendFormat: target.legendFormat })),
  );
}

/**
 * Replaces Grafana's variables by values Prometheus accepts: the interval variables by a range
 * that holds several 1 s scrapes, multi-value variables (used in `=~` matchers) by `.*`, as
 * Grafana's "All" does with this dashboard's `allValue`.
 */
export function withoutGrafanaVariables(expr: string): string {
  return expr
    .replace(/\$__(rate_interval|interval|range)\b/g, '30s')
    .replace(/\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?/g, '.*');
}
