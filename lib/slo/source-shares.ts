/**
 * How much of what the latency model learns one source may supply. A source is who sent the
 * request (the tenant as admission resolves it, else a hash of its credentials, else its
 * address: {@link sourceOf}); each observation is weighted so that no source supplies more than
 * `1 / minSources` of the learned weight once there are two sources or more. With one source
 * (a single application behind the gateway) it is all there is, and it counts in full.
 */
export class SourceShares {
  private readonly counts = new Map<string, number>();
  private total = 0;
  private seen = 0;
  private readonly cap: number;

  constructor(minSources: number) {
    this.cap = 1 / Math.max(2, minSources);
  }

  /** Counts one observation of `source` and returns its weight, in (0, 1]. */
  observe(source: string): number {
    const counts = this.counts;
    const count = (counts.get(source) ?? 0) + 1;
    counts.set(source, count);
    this.total++;
    // Halving every HALF_LIFE observations makes the shares those of recent traffic.
    if (++this.seen % HALF_LIFE === 0) this.halve();
    if (counts.size < 2) return 1;
    const others = this.total - count;
    const cap = this.cap;
    return Math.min(1, (cap * others) / (count * (1 - cap)));
  }

  private halve(): void {
    this.total = 0;
    for (const [source, count] of this.counts) {
      const half = count / 2;
      if (half < 0.5) this.counts.delete(source);
      else {
        this.counts.set(source, half);
        this.total += half;
      }
    }
    // A flood of one-off sources (forged addresses) must not grow the map without bound.
    if (this.counts.size > MAX_SOURCES) {
      const kept = [...this.counts].sort((a, b) => b[1] - a[1]).slice(0, MAX_SOURCES);
      this.counts.clear();
      this.total = 0;
      for (const [source, count] of kept) {
        this.counts.set(source, count);
        this.total += count;
      }
    }
  }
}

const HALF_LIFE = 256;
const MAX_SOURCES = 256;
