/**
 * The words of the receipts' log lines: what the receipts showed, the likely cause, and what the
 * router does about it. The cause is read from where the `elsewhere` receipts fall: on one path
 * only, on some ranks only, or everywhere (the header does not reach the engines as sent).
 */
import type { Distrust, HonourBreakdown } from './verdict';

/** An upstream as the log lines name it. */
export interface NamedUpstream {
  readonly name: string;
  readonly rankHeader: string;
}

const PATHS = { chat: '/v1/chat/completions', completions: '/v1/completions' } as const;

/** The error line: the upstream's rank header is not honoured. */
export function unhonouredLine(upstream: NamedUpstream, header: string, breakdown: HonourBreakdown, elsewhereShare: number, probeEvery: number): string {
  return (
    `express-dp-router: upstream '${upstream.name}' does not honour the rank header: ${breakdown.elsewhere} of its last ${breakdown.total} route receipts ` +
    `found the prompt's new blocks on another rank than the one chosen (elsewhere). Likely cause: ${likelyCause(upstream, header, breakdown, elsewhereShare)}. ` +
    `Its requests now go without a rank header, balanced by vLLM, and every ${ordinal(probeEvery)}one is sent pinned as a probe until receipts show the header honoured again.`
  );
}

function likelyCause(upstream: NamedUpstream, header: string, breakdown: HonourBreakdown, elsewhereShare: number): string {
  if (upstream.rankHeader === 'none') {
    return "`rankHeader: 'none'` sends no rank header, so the server balances its engines itself; use 'local' (the rank − startRank every Python vLLM mode reads) unless each URL serves one engine (external load balancing)";
  }
  const { paths, ranks } = breakdown;
  // A path is not honoured when its share alone passes the threshold, honoured when next to nothing of it went elsewhere.
  const notHonoured = (count: readonly [number, number]) => count[1] >= 3 && count[0] / count[1] >= elsewhereShare;
  const honoured = (count: readonly [number, number]) => count[1] >= 3 && count[0] / count[1] < elsewhereShare / 3;
  const badPaths = [...paths].filter(([, count]) => notHonoured(count)).map(([path]) => path);
  const goodPaths = [...paths].filter(([, count]) => honoured(count)).map(([path]) => path);
  if (badPaths.length === 1 && goodPaths.length > 0) {
    return `vLLM does not route ${PATHS[badPaths[0]]} by the header here (it is honoured on ${goodPaths.map((path) => PATHS[path]).join(', ')}): a front end or vLLM version that balances that path itself`;
  }
  const byRank = [...ranks]
    .sort(([a], [b]) => a - b)
    .map(([rank, [elsewhere, total]]) => `${rank}: ${elsewhere}/${total}`)
    .join(', ');
  return (
    `a proxy between the gateway and vLLM strips \`${header}\`, or the server reads it otherwise than \`rankHeader: '${upstream.rankHeader}'\` sends it ` +
    `(${upstream.rankHeader === 'global' ? 'the global rank' : 'rank − startRank'}), or vLLM does not route this path by the header (elsewhere by rank chosen: ${byRank})`
  );
}

/** The warning line: the exact index of the upstream is not trusted. */
export function untrustedLine(upstream: NamedUpstream, cause: Distrust, bad: number, total: number, probeEvery: number): string {
  const what =
    cause === 'misses'
      ? `${bad} of its last ${total} exact predictions were more than a block above the cached tokens the engine reported: the index holds blocks the engine no longer has (removals not published, or lost)`
      : `${bad} of its last ${total} answers counted other prompt tokens than the router's tokenizer: the tokenizer or chat template differs from the engine's (prefixAware.tokenizer must be the files the engine serves)`;
  return `express-dp-router: upstream '${upstream.name}' is routed on the approximate prefix index: ${what}. One request in ${probeEvery} to it is routed on the exact index as a probe until receipts agree again.`;
}

/** The line when a verdict is lifted. */
export function recoveredLine(upstream: NamedUpstream, what: 'honoured' | 'trusted'): string {
  return what === 'honoured'
    ? `express-dp-router: upstream '${upstream.name}' honours the rank header again (its probes' route receipts are confirmed): requests to it are pinned to their rank again.`
    : `express-dp-router: upstream '${upstream.name}''s exact prefix index agrees with the engine again (its probes' receipts): it is routed on the exact index again.`;
}

/** `10th ` (with its space), or nothing for 1. */
function ordinal(n: number): string {
  if (n === 1) return '';
  const tens = n % 100;
  const suffix = tens >= 11 && tens <= 13 ? 'th' : n % 10 === 1 ? 'st' : n % 10 === 2 ? 'nd' : n % 10 === 3 ? 'rd' : 'th';
  return `${n}${suffix} `;
}
