import { fixed, markdownTable, median, parseArgs } from '../lib/stats';
import { runFleet, type FleetOptions, type FleetPolicy, type FleetResult, type PeersMode } from './fleet';

/**
 * `npm run bench:gateways`: three gateway processes share one mock vLLM under the same load,
 * with local in-flight counts only, with load feedback from the mock's /metrics, and with
 * `peers` (each gateway's in-flight counts announced to the others over UDP, or over Redis), modes
 * alternating. Reports per-rank imbalance of the engines' running requests.
 *
 *   npm run bench:gateways [-- --quick]
 *   npm run bench:gateways -- --single [--feedback-ms 200 --feedback-weight 1 --pinned-share 0.3
 *                                       --rate 120 --seconds 3 --seed 5 --peers udp|redis|0|1
 *                                       --policy least-outstanding|exact]   # one run, its result as JSON
 *   npm run bench:gateways -- --load [--rate-per-gateway 300 --seconds 6 --rounds 3
 *                                     --policy least-outstanding|exact --modes off,udp,redis]
 *
 * `--load` is the cost of peers: the same fleet without peers and with each transport, modes
 * rotating round by round, each gateway's CPU (`process.cpuUsage`, summed) per request and its
 * event-loop delay p99 (a probe preloaded into each gateway, lag-probe.ts) after the warm-up;
 * ratios to peers off are paired per round.
 */
const USAGE =
  'usage: npm run bench:gateways -- [--quick] | --single [--gateways N] [--ranks N] [--rate N] [--seconds N] ' +
  '[--feedback-ms N] [--feedback-weight X] [--pinned-share X] [--decode-ms N] [--seed N] [--peers off|udp|redis|0|1] [--policy least-outstanding|exact] ' +
  '| --load [--rate-per-gateway N] [--seconds N] [--rounds N] [--policy least-outstanding|exact] [--modes off,udp,redis]';

const PEERS_MODES: readonly PeersMode[] = ['off', 'udp', 'redis'];
const POLICIES: readonly FleetPolicy[] = ['least-outstanding', 'exact'];

/** `--peers`: a mode, or 0 / 1 as before the Redis transport (off / UDP). */
function peersMode(value: string | true | undefined): PeersMode {
  if (value === undefined || value === '0') return 'off';
  if (value === '1') return 'udp';
  if (typeof value === 'string' && (PEERS_MODES as readonly string[]).includes(value)) return value as PeersMode;
  throw new Error(`--peers must be off, udp, redis, 0 or 1; ${USAGE}`);
}

function policyOf(value: string | true | undefined): FleetPolicy {
  if (value === undefined) return 'least-outstanding';
  if (typeof value === 'string' && (POLICIES as readonly string[]).includes(value)) return value as FleetPolicy;
  throw new Error(`--policy must be least-outstanding or exact; ${USAGE}`);
}

const SINGLE_FLAGS: Record<string, Exclude<keyof FleetOptions, 'peers' | 'policy'>> = {
  gateways: 'gateways',
  ranks: 'ranks',
  rate: 'rate',
  seconds: 'seconds',
  'feedback-ms': 'feedbackMs',
  'feedback-weight': 'feedbackWeight',
  'pinned-share': 'pinnedShare',
  'decode-ms': 'decodeMsPerToken',
  seed: 'seed',
};

/** One run with the settings given on the command line; prints `{ options, result }` as JSON. */
async function single(args: Map<string, string | true>): Promise<void> {
  const options: FleetOptions = { gateways: 3, ranks: 8, rate: 120, seconds: 4, feedbackMs: 0, feedbackWeight: 0.5, pinnedShare: 0, decodeMsPerToken: 10, seed: 17, peers: peersMode(args.get('peers')), policy: policyOf(args.get('policy')) };
  for (const [flag, value] of args) {
    if (flag === 'single' || flag === 'peers' || flag === 'policy') continue;
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
    policy: 'least-outstanding',
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
    { name: 'local counts only', feedbackMs: 0, feedbackWeight: base.feedbackWeight, peers: 'off' as const },
    { name: 'load feedback 250 ms, weight 0.5', feedbackMs: 250, feedbackWeight: 0.5, peers: 'off' as const },
    { name: 'load feedback 250 ms, weight 1', feedbackMs: 250, feedbackWeight: 1, peers: 'off' as const },
    { name: 'peers (UDP)', feedbackMs: 0, feedbackWeight: base.feedbackWeight, peers: 'udp' as const },
    { name: 'peers (Redis)', feedbackMs: 0, feedbackWeight: base.feedbackWeight, peers: 'redis' as const },
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

/** `--load`: the fleet's CPU per request and event-loop delay with each peers mode, rotating per round. */
async function load(args: Map<string, string | true>): Promise<void> {
  const known = new Set(['load', 'rate-per-gateway', 'seconds', 'rounds', 'policy', 'modes']);
  for (const flag of args.keys()) if (!known.has(flag)) throw new Error(`unknown flag --${flag}; ${USAGE}`);
  const number = (flag: string, fallback: number) => {
    const value = args.get(flag);
    const parsed = value === undefined ? fallback : Number(value);
    if (!(parsed > 0) || !Number.isFinite(parsed)) throw new Error(`--${flag} must be a number > 0; ${USAGE}`);
    return parsed;
  };
  const perGateway = number('rate-per-gateway', 300);
  const seconds = number('seconds', 6);
  const rounds = Math.round(number('rounds', 3));
  const policy = policyOf(args.get('policy'));
  const modesArg = args.get('modes');
  const modes = (typeof modesArg === 'string' ? modesArg.split(',') : ['off', 'udp', 'redis']).map((mode) => peersMode(mode));
  if (!modes.includes('off')) modes.unshift('off');
  const base = { gateways: 3, ranks: 8, rate: 3 * perGateway, seconds, feedbackMs: 0, feedbackWeight: 0.5, pinnedShare: 0, decodeMsPerToken: 10, policy };
  console.log(`3 gateways × ${policy} → one mock vLLM, 8 ranks; ${perGateway} req/s per gateway (Poisson) for ${seconds} s; ${rounds} round(s), modes rotating; figures after a 1 s warm-up\n`);
  const runs = new Map<PeersMode, FleetResult[]>(modes.map((mode) => [mode, []]));
  const ratios = new Map<PeersMode, number[]>(modes.map((mode) => [mode, []]));
  for (let round = 0; round < rounds; round++) {
    const order = modes.map((_, at) => modes[(at + round) % modes.length]);
    const results = new Map<PeersMode, FleetResult>();
    for (const mode of order) {
      const result = await runFleet({ ...base, peers: mode, seed: 17 + round });
      results.set(mode, result);
      runs.get(mode)!.push(result);
      console.error(`round ${round + 1} ${mode.padEnd(5)} cpu ${fixed(result.cpuUsPerRequest, 1)} µs/req, lag p99 ${result.gateways.map((gateway) => fixed(gateway.lagP99Ms, 1)).join('/')} ms, engines max/mean ${fixed(result.averagedMaxOverMean, 3)}, errors ${result.errors}`);
    }
    for (const mode of modes) ratios.get(mode)!.push(results.get(mode)!.cpuUsPerRequest / results.get('off')!.cpuUsPerRequest);
  }
  const rows = modes.map((mode) => {
    const results = runs.get(mode)!;
    const of = (pick: (result: FleetResult) => number) => median(results.map(pick));
    return [
      mode === 'off' ? 'peers off' : `peers (${mode === 'udp' ? 'UDP' : 'Redis'})`,
      fixed(of((result) => result.cpuUsPerRequest), 1),
      `${fixed(median(ratios.get(mode)!), 3)}× (${ratios.get(mode)!.map((ratio) => fixed(ratio, 3)).join(', ')})`,
      fixed(of((result) => result.lagP99Ms), 1),
      fixed(of((result) => result.averagedMaxOverMean), 3),
      String(results.reduce((sum, result) => sum + result.errors, 0)),
    ];
  });
  console.log(markdownTable(['mode', 'gateway CPU µs/request (3 summed)', 'CPU ÷ peers off, per round', 'event-loop delay p99, worst gateway (ms)', 'engines max/mean', 'errors'], rows));
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  if (args.has('single')) return single(args);
  if (args.has('load')) return load(args);
  for (const flag of args.keys()) if (flag !== 'quick') throw new Error(`unknown flag --${flag}; ${USAGE}`);
  return grid(args.has('quick'));
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
