import type { RankState } from './engine';

interface Family {
  name: string;
  type: 'gauge' | 'counter';
  help: string;
  value(rank: RankState, waiting: (globalRank: number) => number): number;
}

/** vLLM's names and help texts; counters are in tokens, as vLLM counts them. */
const FAMILIES: readonly Family[] = [
  {
    name: 'vllm:num_requests_running',
    type: 'gauge',
    help: 'Number of requests in model execution batches.',
    value: (rank) => rank.running,
  },
  {
    name: 'vllm:num_requests_waiting',
    type: 'gauge',
    help: 'Number of requests waiting to be processed.',
    value: (rank, waiting) => waiting(rank.globalRank),
  },
  {
    name: 'vllm:kv_cache_usage_perc',
    type: 'gauge',
    help: 'KV-cache usage. 1 means 100 percent usage.',
    value: (rank) => rank.cache.usage,
  },
  {
    name: 'vllm:prefix_cache_queries_total',
    type: 'counter',
    help: 'Prefix cache queries, in terms of number of queried tokens.',
    value: (rank) => rank.promptTokens,
  },
  {
    name: 'vllm:prefix_cache_hits_total',
    type: 'counter',
    help: 'Prefix cache hits, in terms of number of cached tokens.',
    value: (rank) => rank.cachedTokens,
  },
];

/** The Prometheus text exposition (format 0.0.4) of the ranks' engine metrics. */
export function renderMetrics(model: string, ranks: readonly RankState[], waiting: (globalRank: number) => number = () => 0): string {
  const modelLabel = escapeLabelValue(model);
  const lines: string[] = [];
  for (const family of FAMILIES) {
    lines.push(`# HELP ${family.name} ${family.help}`, `# TYPE ${family.name} ${family.type}`);
    for (const rank of ranks) {
      lines.push(`${family.name}{engine="${rank.globalRank}",model_name="${modelLabel}"} ${family.value(rank, waiting)}`);
    }
  }
  return lines.join('\n') + '\n';
}

function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}
