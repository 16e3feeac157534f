import { getHeapStatistics } from 'node:v8';
import { integerOption } from '../option-checks';

/** The body limits, top-level options of `dpRouter()` and `dpRank()`. */
export interface BodyLimitOptions {
  /** Largest body read when it must be read (body hints, prefix-aware); more answers 413. Default: 16 MiB. */
  maxBodyBytes?: number;
  /**
   * The most memory all requests in flight may hold in request bodies at once: bodies the
   * router reads (prefix-aware, a body affinity key, body hints), bodies held for retries, and
   * the text routing extracts from them, each held until its response ends. A body that would
   * pass it gets a 503 `ServiceUnavailableError` (413 when it alone exceeds it); a body only
   * wanted for a retry is streamed instead, without retries. Default: 512 MiB, or a quarter of
   * V8's heap limit where that is less — 32 bodies of the default `maxBodyBytes` at once.
   */
  maxBufferedBytes?: number;
}

const MAX_BODY_BYTES = 16 * 1024 * 1024;
const MAX_BUFFERED_BYTES = 512 * 1024 * 1024;

/** `maxBodyBytes`. */
export function parseMaxBodyBytes(path: string, value: unknown): number {
  return integerOption(path, value, MAX_BODY_BYTES, 1, 2 ** 31);
}

/** `maxBufferedBytes`: the router's one budget, shared by all its requests. */
export function parseMaxBufferedBytes(path: string, value: unknown): number {
  // Small containers: a quarter of the heap leaves the rest of the process room.
  const fallback = Math.min(MAX_BUFFERED_BYTES, Math.floor(getHeapStatistics().heap_size_limit / 4));
  return integerOption(path, value, fallback, 1, Number.MAX_SAFE_INTEGER);
}

/**
 * The router-wide bound on memory spent on request bodies (`maxBufferedBytes`): bytes buffered
 * to read a body or to hold it for a retry, and the text routing extracts from them, summed
 * over every request in flight. A request that would pass it is refused rather than buffered.
 */
export class BodyBudget {
  // `private`, not `#used`: a `#` field puts `#private` into the published .d.ts, which a
  // consumer compiling for TypeScript's default target (ES5) rejects (TS18028).
  private spent = 0;

  constructor(readonly limit: number) {}

  /** Bytes held now. */
  get used(): number {
    return this.spent;
  }

  /** Starts one request's share, empty. */
  lease(): BodyLease {
    return new BodyLease(this);
  }

  /** @internal Takes `bytes` when they fit. */
  take(bytes: number): boolean {
    if (this.spent + bytes > this.limit) return false;
    this.spent += bytes;
    return true;
  }

  /** @internal */
  give(bytes: number): void {
    this.spent -= bytes;
  }
}

/** One request's share of the budget. `release()` returns all of it, once; a released lease takes nothing more. */
export class BodyLease {
  private holding = 0;
  private open = true;

  constructor(private readonly budget: BodyBudget) {}

  /** Bytes this request holds. */
  get held(): number {
    return this.holding;
  }

  /** Adds `bytes` to the share; false (and nothing taken) when the budget cannot give them. */
  grow(bytes: number): boolean {
    if (!this.open || !this.budget.take(bytes)) return false;
    this.holding += bytes;
    return true;
  }

  /** Gives back part of the share. */
  shrink(bytes: number): void {
    const returned = Math.min(bytes, this.holding);
    this.holding -= returned;
    this.budget.give(returned);
  }

  release(): void {
    if (!this.open) return;
    this.open = false;
    this.budget.give(this.holding);
    this.holding = 0;
  }
}
