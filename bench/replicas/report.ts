import { CACHE_SIZES, REPLICA_COUNTS, type ReplicasReport } from './run';
import { percent, textTable } from '../lib/stats';

const ms = (seconds: number): string => (seconds * 1000).toFixed(0);

/**
 * One table: a row per policy and replica count, and per cache size the hit rate, TTFT p99
 * and max/mean routed tokens per rank.
 */
export function formatReplicasTable(report: ReplicasReport): string {
  const { shape } = report;
  const header = ['policy', 'replicas'];
  for (const cache of CACHE_SIZES) header.push(`hit (${cache.name})`, `TTFT p99 ms`, 'max/mean');
  const rows: string[][] = [];
  const policies = [...new Set(report.results.map((r) => r.policy))];
  for (const policy of policies) {
    for (const replicas of REPLICA_COUNTS) {
      const row = [policy, String(replicas)];
      for (const cache of CACHE_SIZES) {
        const r = report.results.find((x) => x.policy === policy && x.replicas === replicas && x.cache === cache.name);
        row.push(r ? percent(r.hitRate) : '—', r ? ms(r.ttftP99) : '—', r ? r.maxOverMean.toFixed(3) : '—');
      }
      rows.push(row);
    }
  }
  const blocks = CACHE_SIZES.map((cache) => {
    const r = report.results.find((x) => x.cache === cache.name);
    return `${cache.name}: ${r?.rankCacheBlocks ?? '?'} blocks per rank`;
  });
  return [
    `gateway replicas: ${report.ranks} ranks, ${shape.groups} groups × ${shape.promptsPerGroup} prompts, ` +
      `${shape.systemTokens}-token system prompt, ${shape.questionTokens}-token question, concurrency ${shape.concurrency}, ` +
      `requests round-robin over the replicas; seed ${report.seed}; cache ${blocks.join(', ')}`,
    ...textTable(header, rows),
  ].join('\n');
}
