import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { formatTable, formatTargets, renderSvg } from './report';
import { parseSimArgs, type SimArgs } from '../lib/sim-args';
import { runRoutingBenchmark } from './run';

/** `npm run bench:routing -- [--size small|full] [--out DIR] [--seed N] [--trace FILE.jsonl] [--placement-slack N]` */
function parseArgs(argv: readonly string[]): SimArgs & { trace?: string; placementSlack?: number } {
  let trace: string | undefined;
  let placementSlack: number | undefined;
  const args = parseSimArgs(argv, '--size small|full --out DIR --seed N --trace FILE --placement-slack N', (flag, value) => {
    if (flag === '--trace') trace = value;
    else if (flag === '--placement-slack' && /^\d+(\.\d+)?$/.test(value)) placementSlack = Number(value);
    else return false;
    return true;
  });
  return { ...args, trace, placementSlack };
}

const args = parseArgs(process.argv.slice(2));
const report = runRoutingBenchmark({ size: args.size, seed: args.seed, tracePath: args.trace && resolve(args.trace), placementSlack: args.placementSlack });
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
