/**
 * The router-wide bound on memory spent on request bodies (`maxBufferedBytes`): bytes buffered
 * to read a body or to hold it for a retry, and the text routing extracts from them, summed
 * over every request in flight. A request that would pass it is refused rather than buffered.
 */
export class BodyBudget {
  #used = 0;

  constructor(readonly limit: number) {}

  /** Bytes held now. */
  get used(): number {
    return this.#used;
  }

  /** Starts one request's share, empty. */
  lease(): BodyLease {
    return new BodyLease(this);
  }

  /** @internal Takes `bytes` when they fit. */
  take(bytes: number): boolean {
    if (this.#used + bytes > this.limit) return false;
    this.#used += bytes;
    return true;
  }

  /** @internal */
  give(bytes: number): void {
    this.#used -= bytes;
  }
}

/** One request's share of the budget. `release()` returns all of it, once; a released lease takes nothing more. */
export class BodyLease {
  #held = 0;
  #open = true;
  readonly #budget: BodyBudget;

  constructor(budget: BodyBudget) {
    this.#budget = budget;
  }

  /** Bytes this request holds. */
  get held(): number {
    return this.#held;
  }

  /** Adds `bytes` to the share; false (and nothing taken) when the budget cannot give them. */
  grow(bytes: number): boolean {
    if (!this.#open || !this.#budget.take(bytes)) return false;
    this.#held += bytes;
    return true;
  }

  /** Gives back part of the share. */
  shrink(bytes: number): void {
    const returned = Math.min(bytes, this.#held);
    this.#held -= returned;
    this.#budget.give(returned);
  }

  release(): void {
    if (!this.#open) return;
    this.#open = false;
    this.#budget.give(this.#held);
    this.#held = 0;
  }
}
