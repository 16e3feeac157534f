/**
 * npm run bench:overhead [-- --quick] [-- --help]
 *
 * What the router costs next to mounting http-proxy-middleware yourself. A mock upstream
 * and every contender run as separate processes on loopback; with taskset and two cores
 * or more, the upstream and this load generator share core 0 and the contenders core 1
 * (only the contender under test is busy). Each cell (body size × load) runs every
 * contender once per round, rounds rotating the order, so ratios are paired within a
 * round and hold on a noisy machine; the figures are medians over rounds.
 *
 * Writes bench/results/overhead-<time>.json, prints Markdown tables and one PASS/MISS line
 * per target.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describeBuild, prepareLibrary, startContender, type LibraryBuild } from './contender-process';
import { coreCount, cpuPressure, hasTaskset, pinSelf, processCpuMs, startChild, type BenchChild } from '../lib/cpu';
import { fixed, markdownTable, median, parseArgs, signed } from '../lib/stats';
import { runAutocannon, runPaced, type LoadResult, type LoadSpec, type RankExpectation, type RankTally } from './load';
import { completionBody, contenderKind, ROUTABLE_RANKS, VARIANTS } from './scenario';

const HERE = __dirname;

interface Contender {
  id: string;
  /** How the contender process is started: `direct` is a second copy of the upstream. */
  kind: string;
  /** Header-only policies: the throughput and half-load latency targets apply. */
  headerOnly: boolean;
  expect: RankExpectation;
}

const HEADER_ONLY = ['least-outstanding', 'round-robin', 'random', 'power-of-two'];
const BODY_POLICIES = ['session-affinity', 'prefix-aware'];
const ROUTABLE: RankExpectation = { kind: 'routable', ranks: ROUTABLE_RANKS };
const NO_RANK: RankExpectation = { kind: 'none' };

function contenderFor(id: string): Contender {
  if (id === 'upstream-direct') return { id, kind: 'direct', headerOnly: false, expect: NO_RANK };
  if (id === 'baseline') return { id, kind: 'baseline', headerOnly: false, expect: NO_RANK };
  if (id === 'baseline+json') return { id, kind: contenderKind(id), headerOnly: false, expect: NO_RANK };
  if (id === 'bare-http') return { id, kind: 'bare-http', headerOnly: false, expect: NO_RANK };
  if (id === 'baseline+routeropts') return { id, kind: contenderKind(id), headerOnly: false, expect: NO_RANK };
  const match = /^router:([a-z-]+)((?:\+(?:nometrics|noretry|nobuffer|pools1|pools2|admission|tokens|pd|peers|peersredis))*)(?:@\S+)?$/.exec(id);
  if (match) return { id, kind: id, headerOnly: match[2] === '' && HEADER_ONLY.includes(match[1]), expect: ROUTABLE };
  throw new Error(`unknown contender '${id}'`);
}

const DEFAULT_CONTENDERS = [
  'upstream-direct',
  'baseline',
  'baseline+json',
  ...[...HEADER_ONLY, ...BODY_POLICIES].map((policy) => `router:${policy}`),
];

type Mode = 'sat' | 'c1' | 'half';

interface Settings {
  quick: boolean;
  rounds: number;
  satSeconds: number;
  c1Seconds: number;
  halfSeconds: number;
  warmupSeconds: number;
  connections: number;
  bodies: number[];
  halfBodies: number[];
  modes: Mode[];
  contenders: string[];
  out: string;
  pin: boolean;
  build: LibraryBuild;
}

const HELP = `npm run bench:overhead -- [options]
  --quick                one round of ~1 s per cell (a few seconds per contender)
  --rounds N             rounds per cell (default 3; --quick: 1)
  --duration S           seconds per saturation run (default 3; --quick: 1)
  --c1-duration S        seconds per one-connection run (default 1.5; --quick: 1)
  --half-duration S      seconds per half-load run (default 2.5; --quick: 1)
  --warmup S             warm-up per contender and body size (default 1; --quick: 0.5; 0: none)
  --connections N        connections at saturation (default 16)
  --bodies LIST          body sizes in bytes (default 256,8192,32768)
  --half-bodies LIST     body sizes with a half-load cell (default 256,8192)
  --modes LIST           sat,c1,half (default all three)
  --contenders LIST      default: ${DEFAULT_CONTENDERS.join(',')}
                         also: bare-http, baseline+routeropts (the baseline with dpRouter's proxy settings), router:<policy>+nometrics, router:<policy>+noretry (or both)
  --out FILE             JSON result path (default bench/results/overhead-<time>.json)
  --no-pin               do not pin processes to cores
  --tsx                  run the router's TypeScript sources through tsx (diagnostic; default: the compiled package, dist/)`;

function settingsFrom(argv: readonly string[]): Settings {
  const args = parseArgs(argv);
  if (args.has('help')) {
    process.stdout.write(`${HELP}\n`);
    process.exit(0);
  }
  const quick = args.has('quick');
  const num = (name: string, full: number, fast: number, zero = false): number => {
    const value = args.get(name);
    if (value === undefined) return quick ? fast : full;
    const parsed = Number(value);
    if (!Number.isFinite(parsed) || parsed < 0 || (parsed === 0 && !zero)) throw new Error(`--${name} must be a ${zero ? 'non-negative' : 'positive'} number`);
    return parsed;
  };
  const list = (name: string, fallback: string): string[] => {
    const value = args.get(name);
    return (typeof value === 'string' ? value : fallback).split(',').map((item) => item.trim()).filter(Boolean);
  };
  const sizes = (name: string, fallback: string) =>
    list(name, fallback).map((item) => {
      const size = Number(item);
      if (!Number.isInteger(size) || size < 128) throw new Error(`--${name}: '${item}' is not a body size >= 128`);
      return size;
    });
  const modes = list('modes', 'sat,c1,half') as Mode[];
  for (const mode of modes) if (!['sat', 'c1', 'half'].includes(mode)) throw new Error(`--modes: unknown mode '${mode}'`);
  const contenders = list('contenders', DEFAULT_CONTENDERS.join(','));
  contenders.forEach(contenderFor);
  if (!contenders.includes('baseline')) contenders.splice(0, 0, 'baseline');
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  const out = args.get('out');
  return {
    quick,
    rounds: Math.round(num('rounds', 3, 1)),
    satSeconds: num('duration', 3, 1),
    c1Seconds: num('c1-duration', 1.5, 1),
    halfSeconds: num('half-duration', 2.5, 1),
    warmupSeconds: num('warmup', 1, 0.5, true),
    connections: Math.round(num('connections', 16, 16)),
    bodies: sizes('bodies', '256,8192,32768'),
    halfBodies: sizes('half-bodies', '256,8192'),
    modes,
    contenders,
    out: typeof out === 'string' ? resolve(out) : join(HERE, '..', 'results', `overhead-${stamp}.json`),
    pin: !args.has('no-pin'),
    build: args.has('tsx') ? 'tsx' : 'dist',
  };
}

interface RunRecord {
  body: number;
  mode: Mode;
  round: number;
  contender: string;
  /** Offered rate (half load only). */
  rate?: number;
  result: LoadResult;
  /** The contender process's CPU time per response (from /proc), in µs. */
  cpuUsPerRequest?: number;
  /** /proc/pressure/cpu "some avg10" after the run: how much other work competed. */
  cpuPressure?: number;
}

interface CellSummary {
  body: number;
  mode: Mode;
  contender: string;
  rounds: number;
  rate?: number;
  rps: number;
  /** Median over rounds of this round's req/s ÷ the baseline's req/s in the same round. */
  ratioToBaseline: number;
  ratioToBaselineJson: number;
  p50Ms: number;
  p99Ms: number;
  /** Median over rounds of p99 − the baseline's p99 in the same round. */
  p99AddedMs: number;
  /** The contender's CPU µs per request (median over rounds). */
  cpuUsPerRequest: number;
  /** Median over rounds of this CPU per request ÷ the baseline's in the same round. */
  cpuToBaseline: number;
  responses: number;
  rankChecked: number;
  rankWrong: number;
  wrongSamples: string[];
  byRank: Record<string, number>;
  non2xx: number;
  errors: number;
}

function log(message: string): void {
  process.stderr.write(`${message}\n`);
}

function sizeLabel(bytes: number): string {
  return bytes >= 1024 && bytes % 1024 === 0 ? `${bytes / 1024} KB` : `${bytes} B`;
}

async function main(): Promise<void> {
  const settings = settingsFrom(process.argv.slice(2));
  const contenders = settings.contenders.map(contenderFor);
  const cores = coreCount();
  const taskset = settings.pin && cores >= 2 && hasTaskset();
  const pinned = taskset && pinSelf(0);
  const loadCore = pinned ? 0 : undefined;
  const contenderCore = pinned ? 1 : undefined;
  log(
    pinned
      ? `cores: ${cores}; upstream + load generator on core 0, contenders on core 1 (taskset)`
      : `cores: ${cores}; not pinned (${settings.pin ? 'taskset unavailable or one core' : '--no-pin'}): every process competes for every core`,
  );

  prepareLibrary(settings.build, contenders.map((contender) => contender.id));
  log(`router: ${describeBuild(settings.build)}`);
  const children: BenchChild[] = [];
  const stopAll = () => Promise.all(children.map((child) => child.stop()));
  process.once('SIGINT', () => void stopAll().then(() => process.exit(130)));
  try {
    const upstream = await startChild('upstream', join(HERE, 'upstream.ts'), [], loadCore);
    children.push(upstream);
    const processes = new Map<string, BenchChild>();
    await Promise.all(
      contenders.map(async (contender) => {
        const child =
          contender.kind === 'direct'
            ? await startChild(contender.id, join(HERE, 'upstream.ts'), [], contenderCore)
            : await startContender(contender.id, upstream.url, settings.build, contenderCore);
        children.push(child);
        processes.set(contender.id, child);
      }),
    );
    log(`started upstream and ${contenders.length} contenders`);

    const startedAt = Date.now();
    const runs: RunRecord[] = [];
    const rankTotals = new Map<string, RankTally>(contenders.map((c) => [c.id, { checked: 0, wrong: 0, wrongSamples: [], byRank: {} }]));
    const tallyInto = (id: string, tally: RankTally) => {
      const total = rankTotals.get(id)!;
      total.checked += tally.checked;
      total.wrong += tally.wrong;
      for (const sample of tally.wrongSamples) if (total.wrongSamples.length < 5) total.wrongSamples.push(sample);
      for (const [rank, count] of Object.entries(tally.byRank)) total.byRank[rank] = (total.byRank[rank] ?? 0) + count;
    };

    for (const body of settings.bodies) {
      const bodies = Array.from({ length: VARIANTS }, (_, variant) => completionBody(body, variant));
      const headers = Array.from({ length: VARIANTS }, (_, variant) => ({ 'x-session-id': `session-${variant}` }));
      const specOf = (contender: Contender): LoadSpec => ({ url: processes.get(contender.id)!.url, bodies, headers, expect: contender.expect });

      log(`\n== ${sizeLabel(body)} bodies: warm-up ${settings.warmupSeconds} s per contender`);
      for (const contender of settings.warmupSeconds > 0 ? contenders : []) {
        const warm = await runAutocannon(specOf(contender), settings.connections, settings.warmupSeconds);
        tallyInto(contender.id, warm.rank);
      }

      const modes = settings.modes.filter((mode) => mode !== 'half' || settings.halfBodies.includes(body));
      for (const mode of modes) {
        let rate: number | undefined;
        if (mode === 'half') {
          let baselineRps = median(runs.filter((r) => r.body === body && r.mode === 'sat' && r.contender === 'baseline').map((r) => r.result.rps));
          if (!Number.isFinite(baselineRps)) {
            const probe = await runAutocannon(specOf(contenderFor('baseline')), settings.connections, settings.satSeconds);
            baselineRps = probe.rps;
          }
          rate = Math.max(1, Math.round(baselineRps / 2));
        }
        for (let round = 0; round < settings.rounds; round++) {
          const order = contenders.map((_, index) => contenders[(index + round) % contenders.length]);
          for (const contender of order) {
            const spec = specOf(contender);
            const pid = processes.get(contender.id)!.process.pid;
            const cpuBefore = processCpuMs(pid);
            const result =
              mode === 'sat'
                ? await runAutocannon(spec, settings.connections, settings.satSeconds)
                : mode === 'c1'
                  ? await runAutocannon(spec, 1, settings.c1Seconds)
                  : await runPaced(spec, rate!, settings.halfSeconds);
            const cpuAfter = processCpuMs(pid);
            const cpuUsPerRequest =
              cpuBefore !== undefined && cpuAfter !== undefined && result.responses > 0 ? ((cpuAfter - cpuBefore) * 1000) / result.responses : undefined;
            tallyInto(contender.id, result.rank);
            runs.push({ body, mode, round, contender: contender.id, rate, result, cpuUsPerRequest, cpuPressure: cpuPressure() });
            log(
              `${sizeLabel(body).padStart(6)} ${mode.padEnd(4)} r${round + 1} ${contender.id.padEnd(26)} ` +
                `${fixed(result.rps, 0).padStart(7)} req/s  p50 ${fixed(result.p50Ms, 3)} ms  p99 ${fixed(result.p99Ms, 3)} ms  ` +
                `cpu ${fixed(cpuUsPerRequest ?? NaN, 1)} µs/req` +
                (result.rank.wrong > 0 ? `  WRONG RANK ${result.rank.wrong}` : '') +
                (result.non2xx + result.errors > 0 ? `  non2xx ${result.non2xx} errors ${result.errors}` : ''),
            );
          }
        }
      }
    }
    const elapsedSeconds = (Date.now() - startedAt) / 1000;

    const summaries = summarise(runs, settings, contenders);
    const targets = judgeTargets(summaries, rankTotals, contenders, settings);
    const tables = renderTables(summaries, settings, contenders);
    const report = {
      benchmark: 'overhead',
      date: new Date().toISOString(),
      node: process.version,
      cores,
      pinned,
      settings,
      elapsedSeconds,
      summaries,
      rankTotals: Object.fromEntries(rankTotals),
      targets,
      runs,
    };
    mkdirSync(join(settings.out, '..'), { recursive: true });
    writeFileSync(settings.out, `${JSON.stringify(report, null, 2)}\n`);

    process.stdout.write(`# Overhead benchmark\n\n`);
    process.stdout.write(
      `Node ${process.version}, ${cores} cores, ${pinned ? 'upstream + autocannon on core 0, contender on core 1' : 'not pinned'}; ` +
        `${settings.rounds} round(s); saturation = ${settings.connections} connections, no pipelining; ` +
        `figures are medians over rounds; ratios are paired per round. Measured in ${fixed(elapsedSeconds, 0)} s.\n\n` +
        'Columns: *× baseline* is req/s ÷ the baseline\'s in the same round; *CPU µs/req* is the contender process\'s CPU time ' +
        '(/proc utime + stime) per response, the figure that holds when other work shares the machine; *wrong rank* counts ' +
        'responses whose upstream did not see exactly one rank header with a routable rank (router contenders) or saw any ' +
        'rank header (plain proxies).\n\n',
    );
    process.stdout.write(`${tables}\n\n## Targets\n\n`);
    for (const target of targets) process.stdout.write(`${target.pass ? 'PASS' : 'MISS'} ${target.name}: ${target.figure}\n`);
    process.stdout.write(`\nJSON: ${settings.out}\n`);
  } finally {
    await stopAll();
  }
}

function summarise(runs: readonly RunRecord[], settings: Settings, contenders: readonly Contender[]): CellSummary[] {
  const summaries: CellSummary[] = [];
  for (const body of settings.bodies) {
    for (const mode of settings.modes) {
      const cell = runs.filter((r) => r.body === body && r.mode === mode);
      if (cell.length === 0) continue;
      const inRound = (round: number, id: string) => cell.find((r) => r.round === round && r.contender === id)?.result;
      for (const contender of contenders) {
        const own = cell.filter((r) => r.contender === contender.id);
        const ratio = (otherId: string) =>
          median(
            own.flatMap((r) => {
              const other = inRound(r.round, otherId);
              return other && other.rps > 0 ? [r.result.rps / other.rps] : [];
            }),
          );
        const cpuRatio = median(
          own.flatMap((r) => {
            const base = cell.find((x) => x.round === r.round && x.contender === 'baseline');
            return r.cpuUsPerRequest !== undefined && base?.cpuUsPerRequest ? [r.cpuUsPerRequest / base.cpuUsPerRequest] : [];
          }),
        );
        const added = median(
          own.flatMap((r) => {
            const base = inRound(r.round, 'baseline');
            return base ? [r.result.p99Ms - base.p99Ms] : [];
          }),
        );
        const rank = own.reduce(
          (sum, r) => ({
            checked: sum.checked + r.result.rank.checked,
            wrong: sum.wrong + r.result.rank.wrong,
            samples: [...sum.samples, ...r.result.rank.wrongSamples].slice(0, 5),
          }),
          { checked: 0, wrong: 0, samples: [] as string[] },
        );
        const byRank: Record<string, number> = {};
        for (const r of own) for (const [k, v] of Object.entries(r.result.rank.byRank)) byRank[k] = (byRank[k] ?? 0) + v;
        summaries.push({
          body,
          mode,
          contender: contender.id,
          rounds: own.length,
          rate: own[0]?.rate,
          rps: median(own.map((r) => r.result.rps)),
          ratioToBaseline: ratio('baseline'),
          ratioToBaselineJson: ratio('baseline+json'),
          p50Ms: median(own.map((r) => r.result.p50Ms)),
          p99Ms: median(own.map((r) => r.result.p99Ms)),
          p99AddedMs: added,
          cpuUsPerRequest: median(own.flatMap((r) => (r.cpuUsPerRequest === undefined ? [] : [r.cpuUsPerRequest]))),
          cpuToBaseline: cpuRatio,
          responses: own.reduce((sum, r) => sum + r.result.responses, 0),
          rankChecked: rank.checked,
          rankWrong: rank.wrong,
          wrongSamples: rank.samples,
          byRank,
          non2xx: own.reduce((sum, r) => sum + r.result.non2xx, 0),
          errors: own.reduce((sum, r) => sum + r.result.errors + r.result.timeouts, 0),
        });
      }
    }
  }
  return summaries;
}

function renderTables(summaries: readonly CellSummary[], settings: Settings, contenders: readonly Contender[]): string {
  const sections: string[] = [];
  const titles: Record<Mode, string> = {
    sat: `Saturation (${settings.connections} connections)`,
    c1: 'One connection',
    half: "Half load (open loop at half the baseline's saturated req/s; latency from each request's due time)",
  };
  for (const mode of settings.modes) {
    for (const body of settings.bodies) {
      const rows = contenders.flatMap((contender) => {
        const s = summaries.find((x) => x.body === body && x.mode === mode && x.contender === contender.id);
        if (!s) return [];
        const rank = `${s.rankWrong} / ${s.rankChecked}`;
        const failures = `${s.non2xx + s.errors}`;
        return mode === 'half'
          ? [[s.contender, fixed(s.rate ?? NaN, 0), fixed(s.rps, 0), fixed(s.p50Ms, 3), fixed(s.p99Ms, 3), signed(s.p99AddedMs, 3), rank, failures]]
          : [
              [
                s.contender,
                fixed(s.rps, 0),
                `${fixed(s.ratioToBaseline, 3)}×`,
                fixed(s.p50Ms, 3),
                fixed(s.p99Ms, 3),
                fixed(s.cpuUsPerRequest, 1),
                `${fixed(s.cpuToBaseline, 3)}×`,
                rank,
                failures,
              ],
            ];
      });
      if (rows.length === 0) continue;
      const header =
        mode === 'half'
          ? ['contender', 'offered req/s', 'req/s', 'p50 ms', 'p99 ms', 'p99 added ms', 'wrong rank / checked', 'non-2xx + errors']
          : ['contender', 'req/s', '× baseline', 'p50 ms', 'p99 ms', 'CPU µs/req', 'CPU × baseline', 'wrong rank / checked', 'non-2xx + errors'];
      sections.push(`## ${titles[mode]}, ${sizeLabel(body)} bodies\n\n${markdownTable(header, rows)}`);
    }
  }
  return sections.join('\n\n');
}

interface Target {
  name: string;
  pass: boolean;
  figure: string;
}

function judgeTargets(
  summaries: readonly CellSummary[],
  rankTotals: ReadonlyMap<string, RankTally>,
  contenders: readonly Contender[],
  settings: Settings,
): Target[] {
  const targets: Target[] = [];
  const find = (body: number, mode: Mode, id: string) => summaries.find((s) => s.body === body && s.mode === mode && s.contender === id);
  for (const contender of contenders.filter((c) => c.headerOnly)) {
    const sat = settings.bodies.map((body) => find(body, 'sat', contender.id)).filter((s): s is CellSummary => s !== undefined);
    if (sat.length > 0) {
      const worst = Math.min(...sat.map((s) => s.ratioToBaseline));
      targets.push({
        name: `${contender.id} throughput >= 0.95x baseline (saturation)`,
        pass: worst >= 0.95,
        figure: sat
          .map((s) => `${fixed(s.ratioToBaseline, 3)}x at ${sizeLabel(s.body)} (CPU/req ${fixed(s.cpuToBaseline, 3)}x)`)
          .join(', '),
      });
    }
    const half = settings.bodies.map((body) => find(body, 'half', contender.id)).filter((s): s is CellSummary => s !== undefined);
    if (half.length > 0) {
      const worst = Math.max(...half.map((s) => s.p99AddedMs));
      targets.push({
        name: `${contender.id} p99 added <= 1 ms at half load`,
        pass: worst <= 1,
        figure: half.map((s) => `${signed(s.p99AddedMs, 3)} ms at ${sizeLabel(s.body)} (p99 ${fixed(s.p99Ms, 3)} ms)`).join(', '),
      });
    }
  }
  const prefix = find(8192, 'sat', 'router:prefix-aware');
  if (prefix) {
    targets.push({
      name: 'router:prefix-aware with 8 KB bodies >= 0.75x baseline',
      pass: prefix.ratioToBaseline >= 0.75,
      figure: `${fixed(prefix.ratioToBaseline, 3)}x (${fixed(prefix.rps, 0)} req/s; CPU/req ${fixed(prefix.cpuToBaseline, 3)}x)`,
    });
    if (Number.isFinite(prefix.ratioToBaselineJson)) {
      targets.push({
        name: 'router:prefix-aware with 8 KB bodies >= 1.0x baseline+json',
        pass: prefix.ratioToBaselineJson >= 1,
        figure: `${fixed(prefix.ratioToBaselineJson, 3)}x`,
      });
    }
  }
  for (const contender of contenders) {
    const tally = rankTotals.get(contender.id)!;
    const expectation = contender.expect.kind === 'none' ? 'no rank header (plain proxy)' : `one header, rank in {${[...ROUTABLE_RANKS].join(',')}}`;
    targets.push({
      name: `${contender.id} every response carried the right rank (${expectation})`,
      pass: tally.wrong === 0 && tally.checked > 0,
      figure: `${tally.wrong} wrong of ${tally.checked} checked${tally.wrongSamples.length ? ` (e.g. ${tally.wrongSamples.join(', ')})` : ''}`,
    });
  }
  return targets;
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
