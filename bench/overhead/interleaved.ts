/**
 * npx tsx bench/overhead/interleaved.ts [contenderA] [contenderB] [requests] [bytes] [rate] [--pairs=N] [--tsx]
 *
 * An A/B that holds on a noisy machine: both contenders run pinned to the same core and the
 * client alternates its requests between them, so whatever slows the machine down slows both
 * alike. Reports each contender's CPU µs per request (from /proc) and the ratio, per block of
 * requests and as the median over blocks.
 *
 * Without `rate`, 16 client loops keep both busy (closed loop, saturation). With `rate`
 * (requests per second, both together), requests are sent open loop at that rate and each
 * one's latency is taken from its due time; it adds p50 and p99 per contender and p99(B) −
 * p99(A). Half the baseline's saturated rate on one core leaves the shared core half busy:
 * that is the half-load latency comparison.
 *
 * `--pairs=N` runs N pairs of fresh contender processes one after the other, each for
 * `requests`, and reports the median of the pairs' medians: where a process's hidden classes
 * land in memory decides how often V8's stub cache hits, which moves one process's CPU per
 * request by a few percent for its whole life, so a single pair is one draw of that.
 *
 * CPU is reported for all threads of each contender (the figure to compare) and for its main
 * thread alone. Contenders run the compiled package; `--tsx` runs the sources (diagnostic);
 * `<contender>@<git-ref>` runs that revision's router (contender-process.ts).
 */
import { join } from 'node:path';
import { coreCount, hasTaskset, mainThreadCpuMs, pinSelf, processCpuMs, startChild } from '../lib/cpu';
import { fixed, median, quantileSorted, signed } from '../lib/stats';
import { createPoster } from './client';
import { describeBuild, libraryBuildFrom, prepareLibrary, startContender } from './contender-process';

/** What one pair of contender processes measured, block by block. */
interface PairResult {
  ratios: number[];
  mainRatios: number[];
  costs: number[][];
  p50Added: number[];
  p99Added: number[];
}

async function main(): Promise<void> {
  const { build, rest: args } = libraryBuildFrom(process.argv.slice(2));
  const pairsFlag = args.find((arg) => arg.startsWith('--pairs='));
  const pairs = pairsFlag === undefined ? 1 : Number(pairsFlag.slice('--pairs='.length));
  if (!Number.isInteger(pairs) || pairs < 1) throw new Error(`--pairs must be a whole number of at least 1, got ${pairsFlag}`);
  const rest = args.filter((arg) => arg !== pairsFlag);
  const [a = 'baseline', b = 'router:round-robin', total = '60000', bytes = '256', rateArg] = rest;
  const rate = rateArg === undefined ? undefined : Number(rateArg);
  prepareLibrary(build, [a, b]);
  const pinned = coreCount() >= 2 && hasTaskset() && pinSelf(0);
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], pinned ? 0 : undefined);
  console.log(`${a} vs ${b}, ${bytes} B, ${describeBuild(build)}${pinned ? ', both on core 1' : ', not pinned'}${pairs > 1 ? `, ${pairs} pairs of processes` : ''}`);
  const poster = createPoster(Number(bytes));

  const runPair = async (): Promise<PairResult> => {
    const contenders = await Promise.all([a, b].map((id) => startContender(id, upstream.url, build, pinned ? 1 : undefined)));
    const portFor = (turn: number) => contenders[turn % 2].port;

    /** Open loop: request n is due at n / rate; latency counts from then, queueing included. */
    const paced = async (count: number, perSecond: number) => {
      const latencies: number[][] = [[], []];
      const inFlight: Array<Promise<void>> = [];
      const start = performance.now();
      for (let sent = 0; sent < count; ) {
        const due = start + (sent * 1000) / perSecond;
        const wait = due - performance.now();
        if (wait > 0) {
          await new Promise((resolve) => setTimeout(resolve, Math.min(wait, 2)));
          continue;
        }
        const turn = sent++;
        inFlight.push(poster.send(portFor(turn)).then(() => void latencies[turn % 2].push(performance.now() - due)));
      }
      await Promise.all(inFlight);
      return latencies.map((values) => Float64Array.from(values).sort());
    };
    const block = async (count: number) => {
      const before = contenders.map((child) => processCpuMs(child.process.pid)!);
      const beforeMain = contenders.map((child) => mainThreadCpuMs(child.process.pid)!);
      const latencies = rate === undefined ? undefined : await paced(count, rate);
      if (rate === undefined) await poster.run(count, portFor);
      const cpu = contenders.map((child, index) => ((processCpuMs(child.process.pid)! - before[index]) * 1000) / (count / 2));
      const main = contenders.map((child, index) => ((mainThreadCpuMs(child.process.pid)! - beforeMain[index]) * 1000) / (count / 2));
      return { cpu, main, latencies };
    };
    await block(rate === undefined ? 4000 : Math.min(4000, rate * 2));
    const blockSize = 10000;
    const blocks = Math.max(1, Math.round(Number(total) / blockSize));
    const result: PairResult = { ratios: [], mainRatios: [], costs: [[], []], p50Added: [], p99Added: [] };
    for (let index = 0; index < blocks; index++) {
      const { cpu, main, latencies } = await block(blockSize);
      result.costs[0].push(cpu[0]);
      result.costs[1].push(cpu[1]);
      result.ratios.push(cpu[1] / cpu[0]);
      result.mainRatios.push(main[1] / main[0]);
      let line = `block ${index + 1}: ${a} ${cpu[0].toFixed(1)} µs/req, ${b} ${cpu[1].toFixed(1)} µs/req, ratio ${(cpu[1] / cpu[0]).toFixed(3)} (main thread ${(main[1] / main[0]).toFixed(3)})`;
      if (latencies !== undefined) {
        const [p99a, p99b] = latencies.map((sorted) => quantileSorted(sorted, 0.99));
        const [p50a, p50b] = latencies.map((sorted) => quantileSorted(sorted, 0.5));
        result.p50Added.push(p50b - p50a);
        result.p99Added.push(p99b - p99a);
        line += `; p50 ${fixed(p50a, 2)} / ${fixed(p50b, 2)} ms, p99 ${fixed(p99a, 2)} / ${fixed(p99b, 2)} ms`;
      }
      console.log(line);
    }
    await Promise.all(contenders.map((child) => child.stop()));
    return result;
  };

  const medians: number[][] = [[], [], [], []];
  for (let pair = 0; pair < pairs; pair++) {
    const { ratios, mainRatios, costs, p50Added, p99Added } = await runPair();
    let summary = `median${pairs > 1 ? ` (pair ${pair + 1})` : ''}: ${a} ${median(costs[0]).toFixed(1)} µs/req, ${b} ${median(costs[1]).toFixed(1)} µs/req, ${b} / ${a} = ${median(ratios).toFixed(3)} all threads, ${median(mainRatios).toFixed(3)} main thread`;
    if (rate !== undefined) {
      summary += `; at ${rate} req/s, p50 added by ${b}: ${p50Added.map((ms) => signed(ms, 2)).join(', ')} ms (median ${signed(median(p50Added), 2)} ms)`;
      summary += `, p99 added: ${p99Added.map((ms) => signed(ms, 2)).join(', ')} ms (median ${signed(median(p99Added), 2)} ms)`;
    }
    console.log(summary);
    medians[0].push(median(ratios));
    medians[1].push(median(mainRatios));
    if (rate !== undefined) {
      medians[2].push(median(p50Added));
      medians[3].push(median(p99Added));
    }
  }
  if (pairs > 1) {
    let summary = `median of ${pairs} pairs: ${b} / ${a} = ${median(medians[0]).toFixed(3)} all threads (pairs ${medians[0].map((ratio) => ratio.toFixed(3)).join(', ')}), ${median(medians[1]).toFixed(3)} main thread`;
    if (rate !== undefined) summary += `; p50 added ${signed(median(medians[2]), 2)} ms, p99 added ${signed(median(medians[3]), 2)} ms`;
    console.log(summary);
  }
  poster.close();
  await upstream.stop();
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
