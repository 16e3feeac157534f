/**
 * npm run bench:admission [-- --seconds S] [--decode-ms MS]
 *
 * (a) A noisy tenant sending 10× a quiet one's rate at 150 % of the fleet's capacity, against
 *     the mock at fixed capacity (`maxNumSeqs` per rank): the quiet tenant's p99 time to first
 *     token with admission (fair queue) and without (FIFO: every request goes on to the engines,
 *     which queue in arrival order), against what it gets alone; Jain's index of throughput
 *     normalised by each tenant's max-min fair share of what the fleet delivered.
 * (b) is measured by `npm run bench:instructions -- router:round-robin router:round-robin+admission`.
 * (c) The queue's cost per release with 10 000 requests waiting.
 * (d) The error of the token estimate for streams without `usage`, against real token counts.
 * Wall-time figures: take them on a quiet machine, or read them as relative.
 */
import { fixed, markdownTable, parseArgs } from '../lib/stats';
import { capacity, jainIndex, runLoad, type Fleet, type Tenant } from './fairness';
import { releaseCost } from './release-cost';
import { estimateError } from './estimate-error';

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const seconds = Number(args.get('seconds') ?? 8);
  // A slower decode lowers the request rate (and the load generator's own CPU) at the same 150 %.
  const fleet: Fleet = { ranks: 2, seqs: 2, tokens: 10, decodeMs: Number(args.get('decode-ms') ?? 10) };
  const fleetRate = capacity(fleet);
  const offered = 1.5 * fleetRate;
  const quiet: Tenant = { name: 'quiet', rate: offered / 11 };
  const noisy: Tenant = { name: 'noisy', rate: (offered * 10) / 11 };
  const admission = { maxInflightPerRank: fleet.seqs, tenant: { header: 'x-tenant-id', trust: true }, queue: { maxLength: 100_000, timeoutMs: 600_000 } };
  process.stdout.write(`fleet: ${fleet.ranks} ranks × ${fleet.seqs} seqs, ${fleet.tokens} tokens × ${fleet.decodeMs} ms: ${fixed(fleetRate, 1)} req/s; offered ${fixed(offered, 1)} req/s (quiet ${fixed(quiet.rate, 1)}, noisy ${fixed(noisy.rate, 1)}), ${seconds} s each\n\n`);
  const [alone] = await runLoad(fleet, [quiet], seconds, undefined);
  const fifo = await runLoad(fleet, [quiet, noisy], seconds, undefined);
  const fair = await runLoad(fleet, [quiet, noisy], seconds, admission);
  const rows = [
    ['quiet alone', fixed(alone.p50, 1), fixed(alone.p99, 1), '1.00', `${alone.completed}/${alone.sent}`, '–', '–'],
    ...[['FIFO (no admission)', fifo] as const, ['fair queue (admission)', fair] as const].map(([label, results]) => [
      label,
      fixed(results[0].p50, 1),
      fixed(results[0].p99, 1),
      fixed(results[0].p99 / alone.p99, 2),
      `${results[0].completed}/${results[0].sent}`,
      `${results[1].completed}/${results[1].sent}`,
      fixed(jainIndex(results, [quiet, noisy], seconds), 3),
    ]),
  ];
  process.stdout.write(`(a) quiet tenant's time to first token, ms\n\n${markdownTable(['run', 'quiet p50', 'quiet p99', 'p99 × alone', 'quiet done/sent', 'noisy done/sent', "Jain's index"], rows)}\n\n`);
  const costs = [1_000, 10_000].map((waiting) => ({ waiting, ...releaseCost(waiting, Math.min(waiting, 1000)) }));
  // Once more, warm.
  const warm = releaseCost(10_000, 1000);
  costs.push({ waiting: 10_000, ...warm });
  process.stdout.write(
    `(c) queue cost per request, µs (1000 tenants, 3 classes; the last row warm)\n\n${markdownTable(
      ['waiting', 'enqueue µs', 'release µs'],
      costs.map((cost) => [String(cost.waiting), fixed(cost.enqueueUs, 2), fixed(cost.releaseUs, 2)]),
    )}\n`,
  );
  const errors = await estimateError();
  process.stdout.write(
    `\n(d) token estimate for a stream without usage (body bytes / 4 + one per event) vs usage, relative error\n\n${markdownTable(
      ['endpoint', 'mean', 'min', 'max'],
      errors.map((row) => [row.kind, `${fixed(row.mean * 100, 1)} %`, `${fixed(row.min * 100, 1)} %`, `${fixed(row.max * 100, 1)} %`]),
    )}\n`,
  );
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error instanceof Error ? error.stack : error)}\n`);
  process.exit(1);
});
