import { mkdirSync, writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import type { PrefixAwareOptions } from '../../lib/policies/prefix-aware';
import type { Policy } from '../../lib/types';
import { formatReplicasTable } from './report';
import { parseSimArgs, type SimArgs } from '../lib/sim-args';
import { indexBlocksFor, runReplicasBenchmark } from './run';
import { evaluateScenarioTargets, formatScenarios, runScenarios } from './scenarios';

/** `npm run bench:replicas -- [--size small|full] [--out DIR] [--seed N] [--compare FILE.ts]` */
function parseArgs(argv: readonly string[]): SimArgs & { compare: string[] } {
  const compare: string[] = [];
  const args = parseSimArgs(argv, '--size small|full --out DIR --seed N --compare FILE.ts', (flag, value) => {
    if (flag !== '--compare') return false;
    compare.push(value);
    return true;
  });
  return { ...args, compare };
}

type PrefixAwareFactory = (options: PrefixAwareOptions) => Policy;

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  // Another version of the policy (e.g. `git show main:lib/policies/prefix-aware.ts` saved next
  // to it), run with the same options as `approximate`.
  const extra = await Promise.all(
    args.compare.map(async (file) => {
      const { prefixAware } = (await import(resolve(file))) as { prefixAware: PrefixAwareFactory };
      return {
        name: `approximate (${basename(file, '.ts')})`,
        make: ({ rankCacheBlocks }: { rankCacheBlocks: number }) => prefixAware({ maxBlocksPerEndpoint: indexBlocksFor(rankCacheBlocks) }),
      };
    }),
  );
  const report = runReplicasBenchmark({ size: args.size, seed: args.seed, extra });
  // Where exact routing pays: 3 replicas, the timing model, open loop (see scenarios.ts).
  const scenarios = runScenarios(args.seed, args.size === 'small');
  const scenarioTargets = evaluateScenarioTargets(scenarios.results, scenarios.warmup);
  console.log(formatReplicasTable(report));
  console.log(formatScenarios(scenarios));
  const lines = [...report.targets, ...scenarioTargets].map((t) => `${t.pass ? 'PASS' : 'MISS'}  ${t.target}: ${t.measured}`);
  console.log(`\ntargets:\n${lines.join('\n')}`);
  mkdirSync(args.out, { recursive: true });
  const file = join(args.out, `replicas-${report.size}.json`);
  writeFileSync(file, `${JSON.stringify({ ...report, scenarios: scenarios.scenarios, scenarioResults: scenarios.results, scenarioWarmup: scenarios.warmup, scenarioTargets }, null, 2)}\n`);
  console.log(`\nwrote ${file} in ${report.elapsedSeconds.toFixed(1)} s`);
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
