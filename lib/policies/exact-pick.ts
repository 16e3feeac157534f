/**
 * What exact routing hands the prefix-aware policy for one pick, in a module of its own: the
 * policy's and the request path's types reach it, and nothing here imports the optional
 * packages' types.
 */
import type { Endpoint, IndexSource } from '../types';
import type { RouteTicket } from './pick-ticket';

export type { IndexSource } from '../types';

/**
 * One pick's exact view of the candidates, put into the pick context: per candidate the
 * prompt's leading blocks its rank holds, or −1 where the exact index does not serve it.
 */
export class ExactPick {
  /** Set by {@link chose}: which index scored the chosen endpoint. */
  source: IndexSource = 'approximate';
  /** Set by {@link chose} with route receipts on: what the chosen endpoint's receipts are judged against. */
  ticket: RouteTicket | undefined = undefined;

  constructor(
    /** The prompt's full blocks (of the engine's block size). */
    readonly promptBlocks: number,
    /** Per candidate, in the candidates' order: leading blocks held, or −1 (approximate). */
    readonly matched: Int32Array,
    private readonly onChosen: (at: number) => void = () => undefined,
    /** Per candidate, where a lower tier holds blocks of the prompt: `matched` plus those blocks at their tier's weight (`prefixAware.tierWeights`). */
    readonly tiered: Float64Array | undefined = undefined,
    /** With `tiered`: per candidate, the leading blocks held on the GPU and then in a scored lower tier, unweighted. */
    readonly reached: Int32Array | undefined = undefined,
  ) {}

  /** Whether candidate `at` holds the prompt's first `lead` blocks, on the GPU or in a lower tier that is scored. */
  holdsLead(at: number, lead: number): boolean {
    return this.matched[at] >= lead || (this.reached !== undefined && this.reached[at] >= lead);
  }

  /** The policy chose candidate `at`: records speculative entries; returns the index that scored it. */
  chose(at: number): IndexSource {
    this.source = this.matched[at] >= 0 ? 'exact' : 'approximate';
    if (this.source === 'exact') this.onChosen(at);
    return this.source;
  }
}

/** What the request path asks of exact routing. */
export interface ExactLookup {
  /**
   * The exact view of `candidates` for a request as the router holds it: the path the client
   * sent (which says whether it is a chat or a completion) and the JSON body's bytes;
   * `undefined` when the pick is approximate throughout. `from`: who sent it (lib/verdicts), asked
   * only when its evidence is kept.
   */
  lookupRequest(path: string, body: Buffer, candidates: readonly Endpoint[], decoded?: Readonly<Record<string, unknown>>, from?: () => string): ExactPick | undefined;
}
