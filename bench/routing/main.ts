import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { formatTable, formatTargets, renderSvg } from './report';
import type { BenchSize } from './results';
import { runRoutingBenchmark } from './run';

/** `npm run bench:routing -- [--size small|full] [--out DIR] [--seed N] [--trace FILE.jsonl]` */
function parseArgs(argv: readonly string[]): { size: BenchSize; out: string; seed: number; trace?: string } {
  const args = { size: 'full' as BenchSize, out: 'bench/results', seed: 42, trace: undefined as string | undefined };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (flag === '--size' && (value === 'small' || value === 'full')) args.size = value;
    else if (flag === '--out' && value) args.out = value;
    else if (flag === '--seed' && value && Number.isInteger(Number(value))) args.seed = Number(value);
    else if (flag === '--trace' && value) args.trace = value;
    else throw new Error(`unknown or incomplete flag ${flag}; usage: --size small|full --out DIR --seed N --trace FILE`);
    i++;
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
const report = runRoutingBenchmark({ size: args.size, seed: args.seed, tracePath: args.trace && resolve(args.trace) });
console.log(
  `routing simulator: ${report.ranks} ranks, size ${report.size}, seed ${report.seed}; ` +
    `low/high load = ${report.loadLevels.low}/${report.loadLevels.high} of no-cache prefill capacity ` +
    `(multi-turn: think time and start gaps of 20 s / 1 s); hit, balance and same-rank from the high-load run`,
);
console.log(formatTable(report));
console.log(`\ntargets:\n${formatTargets(report)}`);
mkdirSync(args.out, { recursive: true });
const base = join(args.out, `routing-${report.size}`);
writeFileSync(`${base}.json`, `${JSON.stringify(report, null, 2)}\n`);
writeFileSync(`${base}.svg`, renderSvg(report));
console.log(`\nwrote ${base}.json and ${base}.svg in ${report.elapsedSeconds.toFixed(1)} s`);
