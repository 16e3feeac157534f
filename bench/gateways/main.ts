import { parseArgs } from '../lib/stats';
import { runFleet, type FleetOptions, type FleetResult } from './fleet';

/**
 * `npm run bench:gateways`: three gateway processes share one mock vLLM under the same load,
 * with local in-flight counts only, with load feedback from the mock's /metrics, and with
 * `peers` (each gateway's in-flight counts announced to the others), modes alternating. Reports
 * per-rank imbalance of the engines' running requests.
 *
 *   npm run bench:gateways [-- --quick]
 *   npm run bench:gateways -- --single [--feedback-ms 200 --feedback-weight 1 --pinned-share 0.3
 *                                       --rate 120 --seconds 3 --seed 5 --peers 1]   # one run, its result as JSON
 */
const USAGE =
  'usage: npm run bench:gateways -- [--quick] | --single [--gateways N] [--ranks N] [--rate N] [--seconds N] ' +
  '[--feedback-ms N] [--feedback-weight X] [--pinned-share X] [--decode-ms N] [--seed N] [--peers 0|1]';

const SINGLE_FLAGS: Record<string, keyof FleetOptions> = {
  gateways: 'gateways',
  ranks: 'ranks',
  rate: 'rate',
  seconds: 'seconds',
  'feedback-ms': 'feedbackMs',
  'feedback-weight': 'feedbackWeight',
  'pinned-share': 'pinnedShare',
  'decode-ms': 'decodeMsPerToken',
  seed: 'seed',
  peers: 'peers',
};

/** One run with the settings given on the command line; prints `{ options, result }` as JSON. */
async function single(args: Map<string, string | true>): Promise<void> {
  const options: FleetOptions = { gateways: 3, ranks: 8, rate: 120, seconds: 4, feedbackMs: 0, feedbackWeight: 0.5, pinnedShare: 0, decodeMsPerToken: 10, seed: 17, peers: 0 };
  for (const [flag, value] of args) {
    if (flag === 'single') continue;
    const key = SINGLE_FLAGS[flag];
    const number = Number(value);
    if (!key || value === true || !Number.isFinite(number) || number < 0) throw new Error(`--${flag}: unknown flag or not a number ≥ 0; ${USAGE}`);
    options[key] = number;
  }
  const result = await runFleet(options);
  process.stdout.write(`${JSON.stringify({ options, result })}\n`);
}

async function grid(quick: boolean): Promise<void> {
  const rounds = quick ? 1 : 2;
  const base: Omit<FleetOptions, 'feedbackMs' | 'pinnedShare' | 'seed' | 'peers'> = {
    gateways: 3,
    ranks: 8,
    rate: quick ? 120 : 200,
    seconds: quick ? 4 : 12,
    feedbackWeight: 0.5,
    decodeMsPerToken: 10,
  };
  const scenarios = [
    { name: 'even: every request assigned', pinnedShare: 0 },
    { name: "skewed: 30% of gateway 1's requests pinned to rank 0", pinnedShare: 0.3 },
  ];
  const modes = [
    { name: 'local counts only', feedbackMs: 0, feedbackWeight: base.feedbackWeight, peers: 0 },
    { name: 'load feedback 250 ms, weight 0.5', feedbackMs: 250, feedbackWeight: 0.5, peers: 0 },
    { name: 'load feedback 250 ms, weight 1', feedbackMs: 250, feedbackWeight: 1, peers: 0 },
    { name: 'peers', feedbackMs: 0, feedbackWeight: base.feedbackWeight, peers: 1 },
  ];
  console.log(`3 gateways × least-outstanding → one mock vLLM, 8 ranks; ${base.rate} req/s Poisson for ${base.seconds} s; ${rounds} round(s), modes alternating\n`);
  console.log('| scenario | mode | engines max/mean (time-averaged) | engines max/mean (instant, mean) | rank 0 share | errors |');
  console.log('| --- | --- | --- | --- | --- | --- |');
  for (const scenario of scenarios) {
    const results = new Map<string, FleetResult[]>();
    for (let round = 0; round < rounds; round++) {
      for (const mode of modes) {
        const result = await runFleet({ ...base, ...mode, pinnedShare: scenario.pinnedShare, seed: 17 + round });
        results.set(mode.name, [...(results.get(mode.name) ?? []), result]);
      }
    }
    for (const mode of modes) {
      const runs = results.get(mode.name)!;
      const mean = (pick: (result: FleetResult) => number) => runs.reduce((sum, result) => sum + pick(result), 0) / runs.length;
      console.log(
        `| ${scenario.name} | ${mode.name} | ${mean((result) => result.averagedMaxOverMean).toFixed(3)} | ${mean((result) => result.instantMaxOverMean).toFixed(3)} | ${(100 * mean((result) => result.shares[0])).toFixed(1)}% | ${mean((result) => result.errors)} |`,
      );
    }
  }
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  if (args.has('single')) return single(args);
  for (const flag of args.keys()) if (flag !== 'quick') throw new Error(`unknown flag --${flag}; ${USAGE}`);
  return grid(args.has('quick'));
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
