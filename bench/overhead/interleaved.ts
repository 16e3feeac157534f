/**
 * npx tsx bench/overhead/interleaved.ts [contenderA] [contenderB] [requests] [bytes]
 *
 * A CPU-per-request A/B that holds on a noisy machine: both contenders run pinned to the
 * same core and each client loop alternates its requests between them, so whatever slows
 * the machine down slows both alike. Reports each contender's CPU µs per request (from
 * /proc) and the ratio, per block of requests and as the median over blocks.
 */
import { join } from 'node:path';
import { coreCount, hasTaskset, pinSelf, processCpuMs, startChild } from '../lib/cpu';
import { createPoster } from './client';
import { contenderKind } from './scenario';

async function main(): Promise<void> {
  const [a = 'baseline+routeropts', b = 'router:round-robin', total = '60000', bytes = '256'] = process.argv.slice(2);
  const pinned = coreCount() >= 2 && hasTaskset() && pinSelf(0);
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], pinned ? 0 : undefined);
  const contenders = await Promise.all([a, b].map((id) => startChild(id, join(__dirname, 'contender.ts'), [contenderKind(id), upstream.url], pinned ? 1 : undefined)));
  const poster = createPoster(Number(bytes));
  const block = async (count: number) => {
    const before = contenders.map((child) => processCpuMs(child.process.pid)!);
    await poster.run(count, (turn) => contenders[turn % 2].port);
    return contenders.map((child, index) => ((processCpuMs(child.process.pid)! - before[index]) * 1000) / (count / 2));
  };
  await block(4000);
  const blocks = Math.max(1, Math.round(Number(total) / 10000));
  const ratios: number[] = [];
  const costs: number[][] = [[], []];
  for (let index = 0; index < blocks; index++) {
    const [costA, costB] = await block(10000);
    costs[0].push(costA);
    costs[1].push(costB);
    ratios.push(costB / costA);
    console.log(`block ${index + 1}: ${a} ${costA.toFixed(1)} µs/req, ${b} ${costB.toFixed(1)} µs/req, ratio ${(costB / costA).toFixed(3)}`);
  }
  const median = (values: number[]) => [...values].sort((x, y) => x - y)[Math.floor(values.length / 2)];
  console.log(`median: ${a} ${median(costs[0]).toFixed(1)} µs/req, ${b} ${median(costs[1]).toFixed(1)} µs/req, ${b} / ${a} = ${median(ratios).toFixed(3)}`);
  poster.close();
  await Promise.all([...contenders, upstream].map((child) => child.stop()));
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
