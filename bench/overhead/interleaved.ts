/**
 * npx tsx bench/overhead/interleaved.ts [contenderA] [contenderB] [requests] [bytes]
 *
 * A CPU-per-request A/B that holds on a noisy machine: both contenders run pinned to the
 * same core and each client loop alternates its requests between them, so whatever slows
 * the machine down slows both alike. Reports each contender's CPU µs per request (from
 * /proc) and the ratio, per block of requests and as the median over blocks.
 */
import { Agent, request } from 'node:http';
import { join } from 'node:path';
import { coreCount, hasTaskset, pinSelf, processCpuMs, startChild } from '../lib/cpu';
import { completionBody } from './scenario';

async function main(): Promise<void> {
  const [a = 'baseline+routeropts', b = 'router:round-robin', total = '60000', bytes = '256'] = process.argv.slice(2);
  const pinned = coreCount() >= 2 && hasTaskset() && pinSelf(0);
  const kindOf = (id: string) => (id === 'baseline+json' ? 'baseline-json' : id === 'baseline+routeropts' ? 'baseline-routeropts' : id);
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], pinned ? 0 : undefined);
  const contenders = await Promise.all([a, b].map((id) => startChild(id, join(__dirname, 'contender.ts'), [kindOf(id), upstream.url], pinned ? 1 : undefined)));
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });
  const body = completionBody(Number(bytes), 0);
  const send = (port: number) =>
    new Promise<void>((resolve, reject) => {
      const outgoing = request(
        { host: '127.0.0.1', port, path: '/v1/completions', method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
        (response) => {
          response.resume();
          response.on('end', resolve);
        },
      );
      outgoing.on('error', reject);
      outgoing.end(body);
    });
  const block = async (count: number) => {
    const before = contenders.map((child) => processCpuMs(child.process.pid)!);
    let sent = 0;
    await Promise.all(
      Array.from({ length: 16 }, async (_, loop) => {
        for (let turn = loop; sent < count; turn++) {
          sent++;
          await send(contenders[turn % 2].port);
        }
      }),
    );
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
  agent.destroy();
  await Promise.all([...contenders, upstream].map((child) => child.stop()));
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
