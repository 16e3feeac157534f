import { integerOption, pathOf, toggle, type KeysEnum } from '../option-checks';

/**
 * Retries on another upstream when the connection to the chosen one fails before it began to
 * answer (refused, connect timeout, reset): never after a response byte reached the client,
 * never after a first-byte timeout, never for an upstream's own answer (a 5xx is passed
 * through). A hinted request is retried only on replicas of the same rank.
 */
export interface RetryOptions {
  /** Tries per request, the first included; `1` turns retries off. Default: `2`. */
  attempts?: number;
  /**
   * Bodies with a declared `Content-Length` up to this size are held in memory until the
   * upstream answers, so that a retry can replay them byte for byte. Larger bodies, and
   * chunked ones the router did not otherwise read, are streamed and not retried. With a
   * single upstream server nothing is held: there is nowhere to retry. A body `requestBuffering`
   * has read whole is held anyway until the answer begins, and is replayed whatever its size.
   * Default: `1_048_576` (1 MiB).
   */
  maxBodyBytes?: number;
}

/** `retries`, resolved. */
export interface RetryConfig {
  /** Tries per request, the first included (1: no retries). */
  readonly attempts: number;
  /** Largest declared body buffered so that it can be replayed on a retry. */
  readonly maxBodyBytes: number;
}

const ATTEMPTS = 2;
const MAX_BODY_BYTES = 1024 * 1024;
const MAX_ATTEMPTS = 10;
const OFF: RetryConfig = Object.freeze({ attempts: 1, maxBodyBytes: 0 });

const RETRY_KEYS: KeysEnum<RetryOptions> = { attempts: true, maxBodyBytes: true };

/** `retries`: on by default; `false` is one attempt and no body held. */
export function parseRetries(path: string, value: unknown): RetryConfig {
  const retries = toggle(path, value, RETRY_KEYS, true, 'attempts');
  if (retries === undefined) return OFF;
  return {
    attempts: integerOption(pathOf(path, 'attempts'), retries.attempts, ATTEMPTS, 1, MAX_ATTEMPTS),
    maxBodyBytes: integerOption(pathOf(path, 'maxBodyBytes'), retries.maxBodyBytes, MAX_BODY_BYTES, 0, 2 ** 31),
  };
}
