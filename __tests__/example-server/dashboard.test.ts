/**
 * The Grafana dashboard (example-server/grafana-dashboard.json) reads only what the gateway
 * really exports: every metric name in its PromQL is a sample name on the gateway's /metrics,
 * every label in a matcher or a `by (...)` is one that metric carries, and promtool parses
 * every expression. (prometheus.test.ts also evaluates each one against a live Prometheus.)
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { stringify } from 'yaml';
import { parseCommandLine } from '../../example-server/cli';
import { startExampleGateway, type RunningGateway } from '../../example-server/gateway';
import { parseExposition } from '../helpers/app';
import { dashboardQueries, findExecutable, loadDashboard, withoutGrafanaVariables, type DashboardQuery } from '../helpers/prometheus';

/** Labels Prometheus attaches to every scraped series. */
const TARGET_LABELS = ['job', 'instance'];
const FAMILIES = [
  'dp_router_requests_total',
  'dp_router_rank_hints_total',
  'dp_router_inflight_requests',
  'dp_router_request_duration_seconds',
  'dp_router_upstream_errors_total',
  'dp_router_endpoint_healthy',
  'dp_router_time_to_first_token_seconds',
  'dp_router_retries_total',
  'dp_router_ejections_total',
  'dp_router_route_receipts_total',
  'dp_router_prompt_cached_tokens_total',
  'dp_router_upstream_rank_honoured',
  'dp_router_slo_requests_total',
  'dp_router_latency_prediction_error_seconds',
  // vLLM's own, scraped from its API servers (the vllm job), beside the gateway's traffic.
  'vllm:prefix_cache_hits_total',
  'vllm:prefix_cache_queries_total',
];

// --- a PromQL reader, enough to find metric names and the labels each use names ------------

const AGGREGATIONS = new Set(['sum', 'min', 'max', 'avg', 'group', 'stddev', 'stdvar', 'count', 'count_values', 'bottomk', 'topk', 'quantile']);
const KEYWORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'bool', 'and', 'or', 'unless', 'offset', 'atan2']);

interface Token {
  kind: 'ident' | 'string' | 'number' | 'range' | 'punct';
  text: string;
}

function tokenize(expr: string): Token[] {
  const tokens: Token[] = [];
  const pattern =
    /\s+|(?<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)|(?<range>\[[^\]]*\])|(?<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?[smhdwy]*|\.\d+)|(?<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?<punct>=~|!~|!=|==|<=|>=|[(){},=<>+\-*/%^@])/y;
  while (pattern.lastIndex < expr.length) {
    const at = pattern.lastIndex;
    const match = pattern.exec(expr);
    if (!match) throw new Error(`cannot read PromQL at ${JSON.stringify(expr.slice(at))} in ${expr}`);
    const kind = (Object.keys(match.groups!) as Token['kind'][]).find((name) => match.groups![name] !== undefined);
    if (kind) tokens.push({ kind, text: match[0] });
  }
  return tokens;
}

/** What an expression names: metrics with their matcher labels, and label groupings with the metrics they apply to. */
interface PromqlUse {
  selectors: Array<{ metric: string; labels: string[] }>;
  groupings: Array<{ clause: string; labels: string[]; metrics: string[] }>;
}

function analyse(expr: string): PromqlUse {
  const tokens = tokenize(expr);
  const closing = (open: number): number => {
    let depth = 0;
    for (let index = open; index < tokens.length; index++) {
      if (tokens[index].text === '(') depth++;
      if (tokens[index].text === ')' && --depth === 0) return index;
    }
    throw new Error(`unbalanced parentheses in ${expr}`);
  };
  const labelList = (open: number): string[] => {
    if (tokens[open]?.text !== '(') throw new Error(`expected a label list after ${tokens[open - 1].text} in ${expr}`);
    return tokens.slice(open + 1, closing(open)).filter((token) => token.kind === 'ident').map((token) => token.text);
  };
  const metricsIn = (from: number, to: number) => analyseSlice(from, to).selectors.map((selector) => selector.metric);
  const analyseSlice = (from: number, to: number): PromqlUse => {
    const slice: PromqlUse = { selectors: [], groupings: [] };
    for (let index = from; index < to; index++) {
      const token = tokens[index];
      const next = tokens[index + 1];
      if (token.text === '{') throw new Error(`a selector without a metric name in ${expr}: name the metric`);
      if (token.kind !== 'ident') continue;
      if (AGGREGATIONS.has(token.text)) {
        // sum by (a) (arg)  |  sum (arg) by (a)  |  sum (arg)
        let cursor = index + 1;
        const clauses: Array<{ clause: string; labels: string[] }> = [];
        if (tokens[cursor]?.text === 'by' || tokens[cursor]?.text === 'without') {
          clauses.push({ clause: tokens[cursor].text, labels: labelList(cursor + 1) });
          cursor = closing(cursor + 1) + 1;
        }
        const argEnd = closing(cursor);
        let end = argEnd;
        if (tokens[argEnd + 1]?.text === 'by' || tokens[argEnd + 1]?.text === 'without') {
          clauses.push({ clause: tokens[argEnd + 1].text, labels: labelList(argEnd + 2) });
          end = closing(argEnd + 2);
        }
        for (const clause of clauses) slice.groupings.push({ ...clause, metrics: metricsIn(cursor + 1, argEnd) });
        const inner = analyseSlice(cursor + 1, argEnd);
        slice.selectors.push(...inner.selectors);
        slice.groupings.push(...inner.groupings);
        index = end;
        continue;
      }
      if (['on', 'ignoring', 'group_left', 'group_right'].includes(token.text)) {
        if (next?.text === '(') {
          slice.groupings.push({ clause: token.text, labels: labelList(index + 1), metrics: metricsIn(from, to) });
          index = closing(index + 1);
        }
        continue;
      }
      if (KEYWORDS.has(token.text) || next?.text === '(') continue; // keyword or function call
      const labels: string[] = [];
      if (next?.text === '{') {
        let cursor = index + 2;
        while (tokens[cursor]?.text !== '}') {
          const [label, operator, value] = tokens.slice(cursor, cursor + 3);
          if (label?.kind !== 'ident' || !['=', '!=', '=~', '!~'].includes(operator?.text) || value?.kind !== 'string') {
            throw new Error(`cannot read the matchers of ${token.text} in ${expr}`);
          }
          labels.push(label.text);
          cursor += tokens[cursor + 3]?.text === ',' ? 4 : 3;
        }
        index = cursor;
      }
      slice.selectors.push({ metric: token.text, labels });
    }
    return slice;
  };
  return analyseSlice(0, tokens.length);
}

/** Problems of one expression against the exported label sets (sample name → label names). */
function problems(expr: string, exported: ReadonlyMap<string, ReadonlySet<string>>): string[] {
  const found: string[] = [];
  const carries = (metric: string, label: string) => TARGET_LABELS.includes(label) || label === '__name__' || (exported.get(metric)?.has(label) ?? false);
  const use = analyse(expr);
  if (use.selectors.length === 0) found.push('names no metric');
  for (const { metric, labels } of use.selectors) {
    if (!exported.has(metric)) {
      found.push(`${metric} is not exported by the gateway`);
      continue;
    }
    for (const label of labels) if (!carries(metric, label)) found.push(`${metric} has no label ${label} (matcher)`);
  }
  for (const { clause, labels, metrics } of use.groupings) {
    for (const metric of metrics.filter((name) => exported.has(name))) {
      for (const label of labels) if (!carries(metric, label)) found.push(`${metric} has no label ${label} (${clause})`);
    }
  }
  return found;
}

// --- the tests -----------------------------------------------------------------------------

let gateway: RunningGateway;
/** Sample name (with _bucket/_sum/_count) → the label names its samples carry, on the gateway's and vLLM's /metrics. */
const exported = new Map<string, Set<string>>();

beforeAll(async () => {
  const settings = parseCommandLine(['--port', '0', '--dp-size', '2', '--trust-hints', '--drain-timeout-ms', '1000']);
  if (settings === 'help') throw new Error('unexpected help');
  gateway = await startExampleGateway(settings);
  // Some traffic of every kind the dashboard shows: hinted, assigned, malformed.
  for (const headers of [{ 'x-data-parallel-rank': '1' }, {}, { 'x-data-parallel-rank': '07' }] as Array<Record<string, string>>) {
    const answer = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    });
    expect(answer.status).toBe(200);
    await answer.text();
  }
  // The gateway's metrics, and vLLM's (the embedded mock's) that the dashboard sets beside them.
  for (const url of [gateway.url, gateway.mock!.url]) {
    for (const sample of parseExposition(await (await fetch(`${url}/metrics`)).text())) {
      const labels = exported.get(sample.name) ?? new Set<string>();
      Object.keys(sample.labels).forEach((label) => labels.add(label));
      exported.set(sample.name, labels);
    }
  }
});

afterAll(async () => {
  await gateway?.close();
});

describe('the PromQL reader of this test', () => {
  // Proof that the checks below can fail: each of these is wrong in one way.
  it.each([
    ['rate(dp_router_request_total[5m])', 'dp_router_request_total is not exported by the gateway'],
    ['sum by (rank) (rate(dp_router_rank_hints_total[5m]))', 'dp_router_rank_hints_total has no label rank (by)'],
    ['sum(rate(dp_router_rank_hints_total{upstream=~"$upstream"}[5m])) by (rank)', 'dp_router_rank_hints_total has no label upstream (matcher)'],
    ['histogram_quantile(0.9, sum by (le) (rate(dp_router_request_duration_seconds_sum[5m])))', 'dp_router_request_duration_seconds_sum has no label le (by)'],
    ['sum without (engine) (dp_router_inflight_requests)', 'dp_router_inflight_requests has no label engine (without)'],
  ])('flags %s', (expr, problem) => {
    expect(problems(expr, exported)).toContain(problem);
  });

  it('accepts labels that the metric and Prometheus targets carry', () => {
    expect(problems('sum by (instance, job, rank) (rate(dp_router_requests_total{source="hint", upstream!=""}[$__rate_interval]))', exported)).toEqual([]);
  });
});

describe('example-server/grafana-dashboard.json', () => {
  const dashboard = loadDashboard();
  const queries = dashboardQueries();
  const variableQueries = dashboard.templating.list.filter((variable) => variable.type === 'query');

  it('has a datasource variable, and every panel and query uses it', () => {
    const datasource = dashboard.templating.list.find((variable) => variable.name === 'datasource');
    expect(datasource).toMatchObject({ type: 'datasource', query: 'prometheus' });
    const expected = { type: 'prometheus', uid: '${datasource}' };
    for (const panel of dashboard.panels) {
      expect({ panel: panel.title, datasource: panel.datasource }).toEqual({ panel: panel.title, datasource: expected });
      for (const target of panel.targets ?? []) expect({ panel: panel.title, datasource: target.datasource }).toEqual({ panel: panel.title, datasource: expected });
    }
    for (const variable of variableQueries) expect(variable.datasource).toEqual(expected);
  });

  it('has unique panel ids and refIds, and panels that do not overlap on the 24-column grid', () => {
    expect(new Set(dashboard.panels.map((panel) => panel.id)).size).toBe(dashboard.panels.length);
    for (const panel of dashboard.panels) {
      const refIds = (panel.targets ?? []).map((target) => target.refId);
      expect(new Set(refIds).size).toBe(refIds.length);
      expect(panel.gridPos.x + panel.gridPos.w).toBeLessThanOrEqual(24);
    }
    const overlaps = (a: (typeof dashboard.panels)[number]['gridPos'], b: typeof a) =>
      a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
    for (const [index, panel] of dashboard.panels.entries()) {
      for (const other of dashboard.panels.slice(index + 1)) {
        expect({ pair: [panel.title, other.title], overlap: overlaps(panel.gridPos, other.gridPos) }).toEqual({ pair: [panel.title, other.title], overlap: false });
      }
    }
  });

  it('shows every metric family the gateway exports', () => {
    const named = new Set(queries.flatMap((query) => analyse(query.expr).selectors.map((selector) => selector.metric)));
    for (const family of FAMILIES) {
      expect({ family, shown: [...named].some((metric) => metric === family || metric.startsWith(`${family}_`)) }).toEqual({ family, shown: true });
    }
  });

  it('names only metrics the gateway exports, and only labels they carry', () => {
    expect(queries.length).toBeGreaterThanOrEqual(FAMILIES.length);
    expect(Object.fromEntries(queries.map((query) => [query.where, problems(query.expr, exported)]))).toEqual(
      Object.fromEntries(queries.map((query) => [query.where, []])),
    );
  });

  it('uses legend labels that the query keeps', () => {
    for (const query of queries) {
      const kept = new Set(analyse(query.expr).groupings.filter((grouping) => grouping.clause === 'by').flatMap((grouping) => grouping.labels));
      const legend = [...(query.legendFormat ?? '').matchAll(/\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}/g)].map((match) => match[1]);
      expect({ where: query.where, missing: legend.filter((label) => !kept.has(label) || label === 'le') }).toEqual({ where: query.where, missing: [] });
    }
  });

  it('has template variable queries over exported metrics and labels', () => {
    expect(variableQueries.length).toBeGreaterThan(0);
    for (const variable of variableQueries) {
      const query = typeof variable.query === 'string' ? variable.query : (variable.query as { query: string }).query;
      const match = /^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$/.exec(query);
      expect({ variable: variable.name, query, form: match !== null }).toEqual({ variable: variable.name, query, form: true });
      expect(exported.get(match![1])?.has(match![2])).toBe(true);
      if (variable.definition !== undefined) expect(variable.definition).toBe(query);
    }
  });

  it('has PromQL that promtool parses (as recording rules)', () => {
    const promtool = findExecutable('promtool');
    if (!promtool) {
      console.warn('SKIPPED: promtool was not found on PATH or in /usr/bin, so the dashboard PromQL was not parsed. Install Debian\'s `prometheus` package (as .ci/run does).');
      return;
    }
    const rules = {
      groups: [
        {
          name: 'grafana-dashboard',
          rules: queries.map((query: DashboardQuery, index) => ({ record: `dashboard:query_${index}`, expr: withoutGrafanaVariables(query.expr) })),
        },
      ],
    };
    const dir = mkdtempSync(path.join(tmpdir(), 'dp-router-dashboard-'));
    try {
      const file = path.join(dir, 'rules.yml');
      writeFileSync(file, stringify(rules));
      const result = spawnSync(promtool, ['check', 'rules', file], { encoding: 'utf8' });
      expect(result.stdout + result.stderr).toContain(`SUCCESS: ${queries.length} rules found`);
      expect(result.status).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
