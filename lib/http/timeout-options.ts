import { integerOption, MAX_TIMER_MS, pathOf, rejectProxyOnly, section, type KeysEnum } from '../option-checks';

/** The timeout of `dpRank()`: the client's body (408). */
export interface BodyTimeoutOptions {
  /**
   * Time for the request body to arrive in full, from the moment the router sees the request,
   * whether the router reads the body or streams it to the upstream. A body still arriving then
   * gets a 408 `RequestTimeoutError` (the connection is closed and any upstream request
   * destroyed), before Node's own `server.requestTimeout` (300 s) would answer outside vLLM's
   * error shape; keep it below that. Default: `60_000` ms.
   */
  bodyMs?: number;
}

/** Timeouts of `dpRouter()`: the upstream's (exceeding one answers 504) and the client's body (408). */
export interface TimeoutOptions extends BodyTimeoutOptions {
  /** Time to establish the upstream connection. Default: `10_000` ms. */
  connectMs?: number;
  /** Time from dispatch until the upstream's response headers. Default: `600_000` ms. */
  firstByteMs?: number;
}

/** `timeouts`, resolved. */
export interface TimeoutConfig {
  readonly connectMs: number;
  readonly firstByteMs: number;
  /** Time for a request body to arrive in full. */
  readonly bodyMs: number;
}

const CONNECT_MS = 10_000;
const FIRST_BYTE_MS = 600_000;
const BODY_MS = 60_000;

const BODY_TIMEOUT_KEYS: KeysEnum<BodyTimeoutOptions> = { bodyMs: true };
const UPSTREAM_TIMEOUT_KEYS: KeysEnum<Omit<TimeoutOptions, keyof BodyTimeoutOptions>> = { connectMs: true, firstByteMs: true };
const TIMEOUT_KEYS: KeysEnum<TimeoutOptions> = { ...BODY_TIMEOUT_KEYS, ...UPSTREAM_TIMEOUT_KEYS };

/** `timeouts`; without the proxy (`dpRank()`), the upstream's timeouts are refused. */
export function parseTimeouts(path: string, value: unknown, proxying: boolean): TimeoutConfig {
  if (!proxying && value !== null && typeof value === 'object') rejectProxyOnly(path, value as Record<string, unknown>, UPSTREAM_TIMEOUT_KEYS);
  const timeouts = section(path, value, proxying ? TIMEOUT_KEYS : BODY_TIMEOUT_KEYS);
  return {
    connectMs: integerOption(pathOf(path, 'connectMs'), timeouts.connectMs, CONNECT_MS, 1, MAX_TIMER_MS),
    firstByteMs: integerOption(pathOf(path, 'firstByteMs'), timeouts.firstByteMs, FIRST_BYTE_MS, 1, MAX_TIMER_MS),
    bodyMs: integerOption(pathOf(path, 'bodyMs'), timeouts.bodyMs, BODY_MS, 1, MAX_TIMER_MS),
  };
}
