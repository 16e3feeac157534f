import type { BenchReport, WorkloadResult } from './results';
import { percent, textTable } from '../lib/stats';

const ms = (seconds: number): string => (seconds * 1000).toFixed(0);

/** The per-workload comparison table, plain text. */
export function formatTable(report: BenchReport): string {
  const header = [
    'policy',
    'hit',
    'hit∞',
    'max/mean',
    'CoV',
    'same-rank',
    'TTFT p50/p99 low (ms)',
    'TTFT p50/p99 high (ms)',
  ];
  const lines: string[] = [];
  for (const workload of report.workloads) {
    lines.push(
      `\n${workload.workload}: ${workload.description}; ${workload.requests} requests, ` +
        `${workload.rankCacheBlocks} cache blocks per rank; fleet bound hit ${percent(workload.fleetBoundHitRate)}` +
        (workload.ttftFloorP99High === null ? '' : `, TTFT p99 under load ≥ ${(workload.ttftFloorP99High * 1000).toFixed(0)} ms under any routing`),
    );
    const rows = workload.results.map((r) => [
      r.policy,
      percent(r.hitRate),
      percent(r.unboundedHitRate),
      r.maxOverMean.toFixed(3),
      r.cov.toFixed(3),
      r.sameRankRate === null ? '—' : r.sameRankRate.toFixed(3),
      `${ms(r.low.ttftP50)} / ${ms(r.low.ttftP99)}`,
      `${ms(r.ttftP50)} / ${ms(r.ttftP99)}`,
    ]);
    lines.push(...textTable(header, rows));
  }
  return lines.join('\n');
}

/** The targets, one line each with PASS or MISS and the measured figures. */
export function formatTargets(report: BenchReport): string {
  return report.targets.map((t) => `${t.pass ? 'PASS' : 'MISS'}  ${t.target}: ${t.measured}`).join('\n');
}

const COLORS: Record<string, string> = {
  'round-robin': '#9e9e9e',
  random: '#bdbdbd',
  'least-outstanding': '#607d8b',
  'power-of-two': '#78909c',
  'session-affinity': '#8e24aa',
  'prefix-aware': '#d81b60',
  'vllm-internal': '#1e88e5',
  'sglang-cache-aware': '#fb8c00',
  oracle: '#43a047',
};

/** An SVG scatter per workload: token-weighted hit rate against max/mean load, one dot per policy. */
export function renderSvg(report: BenchReport): string {
  const panelWidth = 360;
  const panelHeight = 300;
  const margin = { left: 50, right: 16, top: 36, bottom: 44 };
  const legendHeight = 24 * Math.ceil(Object.keys(COLORS).length / 5);
  const width = panelWidth * report.workloads.length;
  const height = panelHeight + legendHeight + 10;
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="11">`,
    `<rect width="100%" height="100%" fill="white"/>`,
  ];
  report.workloads.forEach((workload, panel) => parts.push(renderPanel(workload, panel * panelWidth, panelWidth, panelHeight, margin)));
  Object.entries(COLORS).forEach(([policy, color], i) => {
    const x = 20 + (i % 5) * 180;
    const y = panelHeight + 14 + Math.floor(i / 5) * 24;
    parts.push(`<circle cx="${x}" cy="${y}" r="5" fill="${color}"/><text x="${x + 10}" y="${y + 4}">${policy}</text>`);
  });
  parts.push('</svg>');
  return parts.join('\n');
}

function renderPanel(
  workload: WorkloadResult,
  offsetX: number,
  width: number,
  height: number,
  margin: { left: number; right: number; top: number; bottom: number },
): string {
  const plotWidth = width - margin.left - margin.right;
  const plotHeight = height - margin.top - margin.bottom;
  const maxX = Math.max(1.5, ...workload.results.map((r) => r.maxOverMean)) * 1.05;
  const x = (v: number) => offsetX + margin.left + ((v - 1) / (maxX - 1)) * plotWidth;
  const y = (v: number) => margin.top + (1 - v) * plotHeight;
  const out: string[] = [
    `<text x="${offsetX + width / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">${workload.workload}</text>`,
    `<rect x="${offsetX + margin.left}" y="${margin.top}" width="${plotWidth}" height="${plotHeight}" fill="none" stroke="#ccc"/>`,
    `<text x="${offsetX + width / 2}" y="${height - 8}" text-anchor="middle">load imbalance (max/mean routed tokens)</text>`,
    `<text transform="translate(${offsetX + 14},${margin.top + plotHeight / 2}) rotate(-90)" text-anchor="middle">prefix hit rate</text>`,
  ];
  for (let tick = 0; tick <= 1.0001; tick += 0.25) {
    out.push(`<text x="${offsetX + margin.left - 4}" y="${y(tick) + 4}" text-anchor="end">${(tick * 100).toFixed(0)}%</text>`);
  }
  // About five labels, whatever the range (multi-turn's SGLang point sits at 8×).
  const step = [0.25, 0.5, 1, 2, 5].find((candidate) => (maxX - 1) / candidate <= 6) ?? 10;
  for (let tick = 1; tick <= maxX; tick += step) {
    out.push(`<text x="${x(tick)}" y="${margin.top + plotHeight + 14}" text-anchor="middle">${step < 1 ? tick.toFixed(2) : tick.toFixed(0)}</text>`);
  }
  out.push(
    `<line x1="${offsetX + margin.left}" x2="${offsetX + margin.left + plotWidth}" y1="${y(workload.fleetBoundHitRate)}" y2="${y(workload.fleetBoundHitRate)}" stroke="#43a047" stroke-dasharray="4 3"/>`,
  );
  for (const r of workload.results) {
    out.push(
      `<circle cx="${x(r.maxOverMean).toFixed(1)}" cy="${y(r.hitRate).toFixed(1)}" r="5" fill="${COLORS[r.policy] ?? 'black'}" fill-opacity="0.85"><title>${r.policy}: hit ${(r.hitRate * 100).toFixed(1)}%, max/mean ${r.maxOverMean.toFixed(3)}</title></circle>`,
    );
  }
  return out.join('\n');
}
