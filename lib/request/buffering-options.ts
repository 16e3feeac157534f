import { fail, integerOption, pathOf, toggle, type KeysEnum } from '../option-checks';

/**
 * Request buffering, an option of `dpRouter()`: a request body the router would otherwise
 * stream is read whole before the upstream connection is opened (nginx's
 * `proxy_request_buffering on`), so that a client sending its body slowly holds a socket of the
 * gateway, not one of vLLM's API server. Bodies the router reads anyway (body hints,
 * `prefix-aware`, a body session key) are read whole already.
 */
export interface RequestBufferingOptions {
  /**
   * Largest body read before the upstream connection is opened; a larger one (by its
   * `Content-Length`, or a chunked body once it passes this size) is streamed, its first bytes
   * included. Buffered bodies count against `maxBufferedBytes`; one the budget cannot hold now
   * is streamed. Default: `1_048_576` (1 MiB).
   */
  maxBytes?: number;
}

/** `requestBuffering`, resolved. */
export interface BufferingConfig {
  /** Largest body buffered before the upstream connection opens; 0 when buffering is off. */
  readonly maxBytes: number;
}

const MAX_BYTES = 1024 * 1024;
const KEYS: KeysEnum<RequestBufferingOptions> = { maxBytes: true };
const OFF: BufferingConfig = Object.freeze({ maxBytes: 0 });

/** `requestBuffering`: on by default (1 MiB); `false` streams every body it does not read anyway. */
export function parseRequestBuffering(path: string, value: unknown, maxBufferedBytes: number): BufferingConfig {
  const buffering = toggle(path, value, KEYS, true);
  if (buffering === undefined) return OFF;
  const maxPath = pathOf(path, 'maxBytes');
  const fallback = Math.min(MAX_BYTES, maxBufferedBytes);
  const maxBytes = integerOption(maxPath, buffering.maxBytes, fallback, 1, 2 ** 31);
  if (maxBytes > maxBufferedBytes) {
    fail(maxPath, `is ${maxBytes}, more than maxBufferedBytes (${maxBufferedBytes}), which would never hold such a body`, `Lower \`${maxPath}\` or raise \`maxBufferedBytes\`.`);
  }
  return { maxBytes };
}
