import type { IncomingMessage } from 'node:http';
import { booleanOption, fail, integerOption, pathOf, section, shown, type KeysEnum } from '../option-checks';

/** Latency objectives per request, and how the router meets them (docs/slo-routing.md). */
export interface SloOptions {
  /**
   * Whether a caller may set its own objectives with `x-slo-ttft-ms` / `x-slo-tpot-ms`. A
   * function decides per request (e.g. from your own authentication). Untrusted headers are
   * removed and ignored. Default: `false`.
   */
  trust?: boolean | ((req: IncomingMessage) => boolean);
  /** Time-to-first-token objective of every request without a trusted header, in ms; 0 for none. Default: 0. */
  ttftMs?: number;
  /** Time-per-output-token objective of every request without a trusted header, in ms; 0 for none. Default: 0. */
  tpotMs?: number;
  /**
   * Answer 503 `ServiceUnavailableError` with `Retry-After` when no rank is predicted to meet a
   * request's objectives, before anything is sent upstream. Default: `false` (the least bad rank).
   */
  shed?: boolean;
}

/** `slo`, resolved. */
export interface SloConfig {
  readonly trust: boolean | ((req: IncomingMessage) => boolean);
  /** Milliseconds; 0: no default objective. */
  readonly ttftMs: number;
  readonly tpotMs: number;
  readonly shed: boolean;
}

/** Request headers carrying objectives (llm-d's names), lower-cased as Node keys them. */
export const TTFT_HEADER = 'x-slo-ttft-ms';
export const TPOT_HEADER = 'x-slo-tpot-ms';
/** An hour: longer objectives are no objectives a router can act on. */
export const MAX_OBJECTIVE_MS = 3_600_000;

const SLO_KEYS: KeysEnum<SloOptions> = { trust: true, ttftMs: true, tpotMs: true, shed: true };

/**
 * `slo`: `undefined` when left out. It needs the `prefix-aware` policy, whose per-rank estimates
 * of the uncached prompt and of the prefill queued ahead the latency model is built on.
 */
export function parseSlo(path: string, value: unknown, policy: unknown): SloConfig | undefined {
  if (value === undefined || value === false) return undefined;
  const slo = section(path, value === true ? {} : value, SLO_KEYS);
  const config: SloConfig = {
    trust: parseSloTrust(pathOf(path, 'trust'), slo.trust),
    ttftMs: integerOption(pathOf(path, 'ttftMs'), slo.ttftMs, 0, 0, MAX_OBJECTIVE_MS),
    tpotMs: integerOption(pathOf(path, 'tpotMs'), slo.tpotMs, 0, 0, MAX_OBJECTIVE_MS),
    shed: booleanOption(pathOf(path, 'shed'), slo.shed, false),
  };
  if (policy !== 'prefix-aware') {
    const named = typeof policy === 'string' ? `'${policy}'` : 'a custom policy';
    fail(path, `needs \`policy: 'prefix-aware'\` (got ${named}): the latency prediction is built on its per-rank cache and queue estimates`, "Set `policy: 'prefix-aware'`, or remove `slo`.");
  }
  return config;
}

function parseSloTrust(path: string, value: unknown): SloConfig['trust'] {
  if (value === undefined) return false;
  if (typeof value === 'boolean' || typeof value === 'function') return value as SloConfig['trust'];
  return fail(path, `must be a boolean or a function (req) => boolean, got ${shown(value)}`, 'Use e.g. `trust: (req) => req.socket.remoteAddress === "127.0.0.1"`.');
}
