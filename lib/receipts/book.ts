/**
 * One upstream's receipts: its counts per rank, its verdicts, the requests whose blocks are
 * awaited in its events, and the gate exact routing reads. Pure bookkeeping; the receipts
 * service (receipts.ts) feeds it and logs what changes.
 */
import { EndpointCounts, KV_OUTCOMES } from './metrics';
import { PendingKeys } from './pending';
import { RouteTicket, type ExactChoice, type ExactGate, type HeldBlocks } from '../policies/pick-ticket';
import { UpstreamVerdicts, type KvOutcome, type Transition, type VerdictSettings } from './verdict';
import type { ReportedUsage } from './usage-json';

/** Answers in a row without `prompt_tokens_details` after which an upstream is taken to no longer report cached tokens. */
const DETAILS_LAPSE = 256;

/** What a book tells when a receipt changed a verdict. */
export type Told = (book: UpstreamBook, transition: Transition) => void;

export class UpstreamBook {
  readonly verdicts: UpstreamVerdicts;
  readonly counts = new Map<number, EndpointCounts>();
  readonly pending: PendingKeys<RouteTicket>;
  /** Its exact index, once exact routing follows it. */
  index: HeldBlocks | undefined = undefined;
  /**
   * Whether its answers carry `prompt_tokens_details` (vLLM's `--enable-prompt-tokens-details`):
   * vLLM 52a31cc leaves the member out when nothing was cached (newer vLLM sends `{"cached_tokens":0}`,
   * usage-json.ts), so until one answer has carried it, an answer without it says nothing; after,
   * it says 0 (until {@link DETAILS_LAPSE} in a row lack it).
   */
  reportsCached = false;
  /**
   * Whether it sends usage on streams nobody asked (vLLM's `--enable-force-include-usage`),
   * learnt from the streams read: such an upstream's streams are read, never asked.
   */
  forcesUsage = false;
  private withoutDetails = 0;
  /** Approximate picks seen while {@link reportsCached} is unknown (one in many has its answer read). */
  looks = 0;
  /** Per rank: stores the index could not key (see {@link RouteTicket.orphans}). */
  private readonly orphans = new Map<number, number>();
  readonly gate: ExactGate;

  constructor(
    readonly name: string,
    public rankHeader: string,
    ranks: readonly number[],
    settings: VerdictSettings & { readonly maxPending: number },
    private readonly told: Told,
  ) {
    this.verdicts = new UpstreamVerdicts(settings);
    this.pending = new PendingKeys(settings.maxPending);
    this.track(ranks);
    const book = this;
    this.gate = {
      get exact() {
        return book.verdicts.exact;
      },
      stored: (rank, key) => {
        if (this.pending.empty) return;
        const ticket = this.pending.take(key, rank);
        if (ticket !== undefined) this.kv(ticket, ticket.rank === rank ? 'confirmed' : this.elsewhere(ticket));
      },
      orphaned: (rank) => {
        this.orphans.set(rank, (this.orphans.get(rank) ?? 0) + 1);
      },
      chose: (choice) => this.ticket(choice),
    };
  }

  /** Follows a change of the upstream's ranks: a zero row for each new one, none left for one gone. */
  track(ranks: readonly number[]): void {
    const wanted = new Set(ranks);
    for (const rank of this.counts.keys()) if (!wanted.has(rank)) this.counts.delete(rank);
    for (const rank of ranks) if (!this.counts.has(rank)) this.counts.set(rank, new EndpointCounts(this.name, String(rank)));
  }

  /** The ticket of an exact pick of `choice.rank`. */
  private ticket(choice: ExactChoice): RouteTicket {
    const { blockSize, tokens, matched, promptBlocks } = choice;
    // vLLM recomputes a prompt's last token (`max_cache_hit_length = num_tokens - 1`,
    // vllm/v1/core/kv_cache_manager.py:219 at 52a31cc): a prompt of whole blocks never hits its last one.
    const predicted = Math.min(matched, Math.floor((tokens - 1) / blockSize)) * blockSize;
    const stores = matched < promptBlocks;
    const ticket = new RouteTicket(
      this.name,
      choice.rank,
      'exact',
      predicted,
      choice.prompts === 1 ? tokens : -1,
      stores,
      stores ? choice.lastKey : NaN,
      choice.heldElsewhere,
      choice.path,
      blockSize,
    );
    ticket.probe = this.verdicts.probing();
    ticket.epoch = this.verdicts.epoch;
    ticket.orphans = this.orphans.get(choice.rank) ?? 0;
    return ticket;
  }

  /**
   * A ticket's blocks found on another rank: `elsewhere`, unless its own rank has since stored
   * blocks the index could not key (its own among them, maybe, after a loss cleared the index:
   * then another request's copy is no evidence, and the receipt is `unseen`).
   */
  private elsewhere(ticket: RouteTicket): KvOutcome {
    return (this.orphans.get(ticket.rank) ?? 0) === ticket.orphans ? 'elsewhere' : 'unseen';
  }

  /**
   * The answer to an exact ticket ended whole: its KV receipt, at once where the index shows
   * where its blocks went (or that nothing new was stored), else once its events come (`pending`);
   * `undefined` when there is nothing to await.
   */
  answered(ticket: RouteTicket, now: number, dueMs: number): KvOutcome | 'pending' | undefined {
    if (!ticket.stores) return this.kv(ticket, 'cached');
    const index = this.index;
    const key = ticket.key;
    if (index === undefined || Number.isNaN(key)) return undefined;
    if (index.heldBy(ticket.rank, key)) return this.kv(ticket, 'confirmed');
    // Another rank holding the whole prompt already proves nothing: it may have stored it before.
    if (!ticket.heldElsewhere) {
      for (const rank of index.ranks) if (rank !== ticket.rank && index.heldBy(rank, key)) return this.kv(ticket, this.elsewhere(ticket));
    }
    this.pending.add(ticket, now + dueMs, this.unseen);
    return 'pending';
  }

  /** Requests whose blocks were due by `now` and never came count `unseen`. */
  sweep(now: number): void {
    this.pending.sweep(now, this.unseen);
  }

  private readonly unseen = (ticket: RouteTicket): void => {
    this.kv(ticket, 'unseen');
  };

  private kv(ticket: RouteTicket, outcome: KvOutcome): KvOutcome {
    const counts = this.counts.get(ticket.rank);
    if (counts !== undefined) counts.outcomes[KV_OUTCOMES.indexOf(outcome)]++;
    const transition = this.verdicts.kv(outcome, ticket.epoch, ticket.rank, ticket.path, ticket.source);
    if (transition !== undefined) this.told(this, transition);
    return outcome;
  }

  /**
   * The usage of a ticket's answer: predicted and reported cached tokens counted (when the
   * engine reports them), and for an exact ticket the verdict fed. Returns the two counts.
   */
  usage(ticket: RouteTicket, usage: ReportedUsage): { predicted: number; reported: number } | undefined {
    const exact = ticket.index === 'exact';
    // Several prompts: the engine's usage sums them all, the prediction is the first's.
    if (exact && ticket.promptTokens < 0) return undefined;
    if (usage.cachedTokens !== undefined) {
      this.reportsCached = true;
      this.withoutDetails = 0;
    } else if (this.reportsCached && ++this.withoutDetails >= DETAILS_LAPSE) {
      this.reportsCached = false;
    }
    const reported = usage.cachedTokens ?? (this.reportsCached ? 0 : undefined);
    const predicted = exact ? ticket.predicted : Math.round(ticket.predicted * usage.promptTokens);
    if (reported !== undefined) {
      const counts = this.counts.get(ticket.rank);
      if (counts !== undefined) {
        counts.tokens[0] += predicted;
        counts.tokens[1] += reported;
      }
    }
    if (exact) {
      const missed = reported === undefined || predicted < ticket.blockSize ? undefined : reported + ticket.blockSize < predicted;
      const transition = this.verdicts.usage(ticket.epoch, missed, usage.promptTokens !== ticket.promptTokens, ticket.source);
      if (transition !== undefined) this.told(this, transition);
    }
    return reported === undefined ? undefined : { predicted, reported };
  }
}
