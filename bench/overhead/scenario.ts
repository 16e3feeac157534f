/** What every router contender is configured with, and how responses are judged. */

/** The seed scenario: ranks 0, 2, 4, 6 of an 8-rank server (so a stray 1, 3, 5 or 7 is caught). */
export const ROUTER_UPSTREAM = { dataParallelSize: 8, ranks: [0, 2, 4, 6] } as const;
export const ROUTABLE_RANKS: ReadonlySet<string> = new Set(ROUTER_UPSTREAM.ranks.map(String));

/** Distinct request bodies per size: distinct prompts (prefix-aware) and sessions (affinity). */
export const VARIANTS = 8;

/** A `/v1/completions` body of exactly `size` bytes whose prompt starts with a variant-specific prefix. */
export function completionBody(size: number, variant: number): Buffer {
  const head = `{"model":"bench","max_tokens":16,"user":"user-${variant}","prompt":"`;
  const tail = '"}';
  const fill = size - head.length - tail.length;
  if (fill < 16) throw new Error(`body size ${size} is too small`);
  const prefix = `variant ${variant} system prompt: `;
  const words = 'the quick brown fox jumps over the lazy dog ';
  let prompt = prefix;
  while (prompt.length < fill) prompt += words;
  return Buffer.from(head + prompt.slice(0, fill) + tail);
}

/** The contender process kind behind a contender's display name (`baseline+json` → `baseline-json`). */
export function contenderKind(id: string): string {
  return id === 'baseline+json' ? 'baseline-json' : id === 'baseline+routeropts' ? 'baseline-routeropts' : id;
}
