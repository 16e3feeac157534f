import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { formatReplicasTable } from './report';
import { type ReplicasSize, runReplicasBenchmark } from './run';

/** `npm run bench:replicas -- [--size small|full] [--out DIR] [--seed N]` */
function parseArgs(argv: readonly string[]): { size: ReplicasSize; out: string; seed: number } {
  const args = { size: 'full' as ReplicasSize, out: 'bench/results', seed: 42 };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (flag === '--size' && (value === 'small' || value === 'full')) args.size = value;
    else if (flag === '--out' && value) args.out = value;
    else if (flag === '--seed' && value && Number.isInteger(Number(value))) args.seed = Number(value);
    else throw new Error(`unknown or incomplete flag ${flag}; usage: --size small|full --out DIR --seed N`);
    i++;
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
const report = runReplicasBenchmark({ size: args.size, seed: args.seed });
console.log(formatReplicasTable(report));
console.log(`\ntargets:\n${report.targets.map((t) => `${t.pass ? 'PASS' : 'MISS'}  ${t.target}: ${t.measured}`).join('\n')}`);
mkdirSync(args.out, { recursive: true });
const file = join(args.out, `replicas-${report.size}.json`);
writeFileSync(file, `${JSON.stringify(report, null, 2)}\n`);
console.log(`\nwrote ${file} in ${report.elapsedSeconds.toFixed(1)} s`);
