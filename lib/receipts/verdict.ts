/**
 * What an upstream's recent receipts say, as two verdicts (pure logic, no I/O):
 *
 * - **honoured**: of its exact receipts that found the prompt's new blocks somewhere, the share
 *   found on another rank than the one chosen (`elsewhere`) stays under `elsewhereShare`;
 * - **trusted** (its exact index): the shares of its exact predictions the engine's usage
 *   contradicts (more than one block fewer cached tokens than predicted; another prompt token
 *   count) stay under `missShare`.
 *
 * `unseen` receipts judge nothing: after a lost batch the index is cleared, and the blocks
 * engines then store under prefixes cached before it have no parent the index knows (it skips
 * them, exact-index.ts), so a loss of 1 % of the batches leaves far more than 1 % unseen while
 * every verdict still holds. A tokenizer or template that drifts shows in the token counts.
 *
 * Each verdict is taken over the last `window` receipts of its kind once there are
 * `minReceipts` of them. While either is against the upstream, it is routed without the exact
 * index (and, when not honoured, without a rank header) except for one probe every
 * `probeEvery` requests to it; its windows hold only receipts taken since the verdict (an
 * epoch), and it recovers once the probes' receipts stay under half the share that tripped it.
 *
 * Receipts are client traffic: a verdict is taken only when the bad receipts in the window come
 * from `minSources` distinct sources, each source's bad receipts counted at most its fair part of
 * the share (lib/verdicts); past the share with fewer, the window reports a refusal instead, once
 * until it drops under the share again.
 */
import type { PromptPath } from '../policies/pick-ticket';

export type KvOutcome = 'confirmed' | 'elsewhere' | 'unseen' | 'cached';

/** The thresholds, from `receipts`. */
export interface VerdictSettings {
  readonly window: number;
  readonly minReceipts: number;
  readonly elsewhereShare: number;
  readonly missShare: number;
  readonly probeEvery: number;
  /** Distinct sources whose bad receipts must agree before a verdict is taken. Default: 1. */
  readonly minSources?: number;
}

/** Why the index is not trusted: the window that tripped. */
export type Distrust = 'misses' | 'tokens';

/** Elsewhere counts of the honour window, for the log line naming a likely cause. */
export interface HonourBreakdown {
  readonly elsewhere: number;
  readonly total: number;
  /** Per prompt path: [elsewhere, total]. */
  readonly paths: ReadonlyMap<PromptPath, readonly [number, number]>;
  /** Per rank: [elsewhere, total]. */
  readonly ranks: ReadonlyMap<number, readonly [number, number]>;
}

export type Transition =
  | { kind: 'unhonoured'; breakdown: HonourBreakdown; sources: number }
  | { kind: 'honoured' }
  | { kind: 'untrusted'; cause: Distrust; bad: number; total: number; sources: number }
  | { kind: 'trusted' }
  /** Past the share, from too few sources: nothing changes. */
  | { kind: 'refused'; cause: Distrust | 'elsewhere'; bad: number; total: number; sources: number };

/** The last receipts of one kind: each good or bad, with a tag (a rank, a path). */
class Recent {
  private readonly bads: Uint8Array;
  private readonly ranks: Float64Array;
  private readonly paths: Uint8Array;
  /** Who each receipt's request came from (lib/verdicts/source.ts). */
  private readonly sources: Array<string | undefined>;
  private at = 0;
  size = 0;
  bad = 0;
  /** A refusal was reported since the share was last crossed. */
  refusedTold = false;

  constructor(private readonly capacity: number) {
    this.bads = new Uint8Array(capacity);
    this.ranks = new Float64Array(capacity);
    this.paths = new Uint8Array(capacity);
    this.sources = new Array<string | undefined>(capacity);
  }

  push(bad: boolean, rank = 0, path: PromptPath | undefined = undefined, source: string | undefined = undefined): void {
    if (this.size === this.capacity) this.bad -= this.bads[this.at];
    else this.size++;
    this.sources[this.at] = source;
    this.bads[this.at] = bad ? 1 : 0;
    this.ranks[this.at] = rank;
    this.paths[this.at] = path === 'completions' ? 2 : path === 'chat' ? 1 : 0;
    if (bad) this.bad++;
    this.at = (this.at + 1) % this.capacity;
  }

  clear(): void {
    this.size = this.bad = this.at = 0;
    this.refusedTold = false;
  }

  /**
   * Whether the bad receipts reach `share` of the window when each source counts at most its
   * part of what the share needs (`needed / minSources`), from at least `minSources` sources;
   * with how many sources they came from.
   */
  agreed(share: number, minSources: number): { agreed: boolean; sources: number } {
    const counts = new Map<string, number>();
    for (let i = 0; i < this.size; i++) {
      if (this.bads[i] === 0) continue;
      const source = this.sources[i] ?? '';
      counts.set(source, (counts.get(source) ?? 0) + 1);
    }
    const needed = Math.ceil(share * this.size);
    const cap = Math.max(1, Math.ceil(needed / minSources));
    let weight = 0;
    for (const count of counts.values()) weight += Math.min(count, cap);
    return { agreed: counts.size >= minSources && weight >= needed, sources: counts.size };
  }

  share(): number {
    return this.size === 0 ? 0 : this.bad / this.size;
  }

  breakdown(): HonourBreakdown {
    const paths = new Map<PromptPath, [number, number]>();
    const ranks = new Map<number, [number, number]>();
    for (let i = 0; i < this.size; i++) {
      const bad = this.bads[i];
      const path = this.paths[i] === 2 ? 'completions' : this.paths[i] === 1 ? 'chat' : undefined;
      if (path !== undefined) tally(paths, path, bad);
      tally(ranks, this.ranks[i], bad);
    }
    return { elsewhere: this.bad, total: this.size, paths, ranks };
  }
}

function tally<K>(counts: Map<K, [number, number]>, key: K, bad: number): void {
  const count = counts.get(key) ?? [0, 0];
  count[0] += bad;
  count[1]++;
  counts.set(key, count);
}

/** The verdicts on one upstream, and its probes. */
export class UpstreamVerdicts {
  honoured = true;
  trusted = true;
  /** Receipts of tickets from an earlier epoch are counted in metrics but judge nothing. */
  epoch = 0;
  /** The next exact pick of this upstream is a probe. */
  probeDue = false;
  private sinceProbe = 0;
  private readonly honour: Recent;
  private readonly predictions: Recent;
  private readonly tokens: Recent;

  constructor(private readonly settings: VerdictSettings) {
    this.honour = new Recent(settings.window);
    this.predictions = new Recent(settings.window);
    this.tokens = new Recent(settings.window);
  }

  /** Whether the upstream is scored on its exact index now. */
  get exact(): boolean {
    return (this.honoured && this.trusted) || this.probeDue;
  }

  /** A request was routed to this upstream: while a verdict is against it, every `probeEvery`-th makes the next exact pick a probe. */
  routed(): void {
    if (this.honoured && this.trusted) return;
    if (++this.sinceProbe >= this.settings.probeEvery) this.probeDue = true;
  }

  /** An exact pick of this upstream: whether it is the due probe (then the next is due `probeEvery` requests later). */
  probing(): boolean {
    if (!this.probeDue) return false;
    this.probeDue = false;
    this.sinceProbe = 0;
    return true;
  }

  /** A KV receipt of an exact ticket of `epoch`, for `rank` on `path`. */
  kv(outcome: KvOutcome, epoch: number, rank: number, path: PromptPath | undefined, source?: string): Transition | undefined {
    if (epoch !== this.epoch || outcome === 'cached' || outcome === 'unseen') return undefined;
    this.honour.push(outcome === 'elsewhere', rank, path, source);
    return this.judge();
  }

  /**
   * A usage receipt of an exact ticket of `epoch`: `missed` when the engine reported more than
   * a block fewer cached tokens than predicted (`undefined`: nothing was predicted, or the
   * engine does not report them), `differs` when its prompt token count is not the router's
   * (`undefined`: not comparable).
   */
  usage(epoch: number, missed: boolean | undefined, differs: boolean | undefined, source?: string): Transition | undefined {
    if (epoch !== this.epoch) return undefined;
    if (missed !== undefined) this.predictions.push(missed, 0, undefined, source);
    if (differs !== undefined) this.tokens.push(differs, 0, undefined, source);
    return this.judge();
  }

  private judge(): Transition | undefined {
    const { minReceipts, elsewhereShare, missShare } = this.settings;
    const minSources = this.settings.minSources ?? 1;
    if (this.honoured && this.honour.size >= minReceipts && this.honour.share() >= elsewhereShare) {
      const { agreed, sources } = this.honour.agreed(elsewhereShare, minSources);
      if (agreed) {
        const breakdown = this.honour.breakdown();
        this.honoured = false;
        this.restart();
        return { kind: 'unhonoured', breakdown, sources };
      }
      if (!this.honour.refusedTold) {
        this.honour.refusedTold = true;
        return { kind: 'refused', cause: 'elsewhere', bad: this.honour.bad, total: this.honour.size, sources };
      }
    } else if (this.honoured) this.honour.refusedTold = false;
    if (this.trusted) {
      for (const [cause, recent] of [['misses', this.predictions], ['tokens', this.tokens]] as const) {
        if (recent.size < minReceipts || recent.share() < missShare) {
          recent.refusedTold = false;
          continue;
        }
        const { bad, size } = recent;
        const { agreed, sources } = recent.agreed(missShare, minSources);
        if (!agreed) {
          if (recent.refusedTold) continue;
          recent.refusedTold = true;
          return { kind: 'refused', cause, bad, total: size, sources };
        }
        this.trusted = false;
        this.restart();
        return { kind: 'untrusted', cause, bad, total: size, sources };
      }
    }
    // Recovery: on the probes' receipts, each window that has enough of them well under its share.
    if (!this.honoured && this.honour.size >= minReceipts && this.honour.share() < elsewhereShare / 2) {
      this.honoured = true;
      this.honour.clear();
      return { kind: 'honoured' };
    }
    if (!this.trusted) {
      const judged = [this.predictions, this.tokens].filter((recent) => recent.size >= minReceipts);
      if (judged.length > 0 && judged.every((recent) => recent.share() < missShare / 2)) {
        this.trusted = true;
        for (const recent of [this.predictions, this.tokens]) recent.clear();
        return { kind: 'trusted' };
      }
    }
    return undefined;
  }

  /** A verdict changed against the upstream: its windows start over, with the probes' receipts alone. */
  private restart(): void {
    this.epoch++;
    this.sinceProbe = 0;
    this.probeDue = false;
    for (const recent of [this.honour, this.predictions, this.tokens]) recent.clear();
  }
}
