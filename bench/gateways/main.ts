import { runFleet, type FleetOptions, type FleetResult } from './fleet';

/**
 * `npm run bench:gateways`: three gateway processes share one mock vLLM under the same load,
 * once with local in-flight counts only and once with load feedback from the mock's
 * /metrics, alternating A B A B. Reports per-rank imbalance of the engines' running requests.
 */
async function main(): Promise<void> {
  const quick = process.argv.includes('--quick');
  const rounds = quick ? 1 : 2;
  const base: Omit<FleetOptions, 'feedbackMs' | 'pinnedShare' | 'seed'> = {
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
    { name: 'local counts only', feedbackMs: 0, feedbackWeight: base.feedbackWeight },
    { name: 'load feedback 250 ms, weight 0.5', feedbackMs: 250, feedbackWeight: 0.5 },
    { name: 'load feedback 250 ms, weight 1', feedbackMs: 250, feedbackWeight: 1 },
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

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
