import { fail, pathOf, shown } from '../option-checks';
import type { DecisionSource, Endpoint, HintOutcome } from '../types';

/**
 * Receives the router's logs, in pino's calling convention: `(fields, message)` for structured
 * lines, `(message)` for notices. pino's logger (a child logger too) and `console` fit as they are.
 */
export interface Logger {
  warn(message: string): void;
  info?(fields: object, message: string): void;
  debug?(fields: object, message: string): void;
  error?(fields: object, message: string): void;
  /** pino's level check; without it no per-request line is written. */
  isLevelEnabled?(level: string): boolean;
}

/** The logger as the router uses it: pino's calling convention, every level present. */
export interface RouterLogger {
  /** A run-time notice (a body parser mounted first, ranks discovered), as a plain message. */
  warn(message: string): void;
  /** A misconfiguration or deployment fault the router works around but the operator must fix (a refused rank header, route receipts): `error` when the logger has it, else a notice. */
  error(fields: object, message: string): void;
  /** The end of such a condition, at info level (nothing without `info`). */
  info(fields: object, message: string): void;
  /**
   * Whether {@link decided} and {@link retried} can ever write: false for the default and for
   * `false`, and for a logger without `debug` and `isLevelEnabled` (console), so that the router
   * does not tell them each request's decision.
   */
  readonly perRequest: boolean;
  /** The request's routing decision, at debug level; free when debug is off. */
  decided(endpoint: Endpoint, source: DecisionSource, policy: string, hintOutcome: HintOutcome | undefined): void;
  /** A request sent again to another endpoint, at debug level. */
  retried(failed: Endpoint, next: Endpoint): void;
  /** An endpoint left rotation, at info level: an event the router handles, not a fault of its own. */
  ejected(endpoint: Endpoint): void;
  /**
   * An upstream's health check verdict changed, once per change: going down as a notice
   * (`warn`), coming back at info, each naming the upstream and its ranks.
   */
  healthChanged(upstream: string, ranks: readonly number[], healthy: boolean, why: string): void;
  /**
   * Disaggregated requests began to be served decode-only (`fellBack`: a notice, `warn`), or a
   * prefill leg succeeded again after they were (info, with `fields`); told once per change.
   */
  decodeOnly(message: string, fellBack: boolean, fields?: object): void;
}

const LEVELS = ['debug', 'info', 'error'] as const;

const SILENT: RouterLogger = {
  perRequest: false,
  warn: () => undefined,
  error: () => undefined,
  info: () => undefined,
  decided: () => undefined,
  retried: () => undefined,
  ejected: () => undefined,
  healthChanged: () => undefined,
  decodeOnly: () => undefined,
};
const PROCESS_WARNINGS: RouterLogger = {
  ...SILENT,
  warn: (message) => process.emitWarning(message, { code: 'DP_ROUTER' }),
  error: (_fields, message) => process.emitWarning(message, { code: 'DP_ROUTER' }),
  healthChanged: (upstream, ranks, healthy, why) => {
    if (!healthy) process.emitWarning(healthLine(upstream, ranks, healthy, why), { code: 'DP_ROUTER' });
  },
  decodeOnly: (message, fellBack) => {
    if (fellBack) process.emitWarning(message, { code: 'DP_ROUTER' });
  },
};

function healthLine(upstream: string, ranks: readonly number[], healthy: boolean, why: string): string {
  return `express-dp-router: upstream '${upstream}' ${why}: ranks ${ranks.join(', ')} ${healthy ? 'back in' : 'out of'} rotation`;
}

/**
 * Resolves the `logger` option. pino's logger (and anything shaped like it) is used as it is;
 * per-request lines go only to a logger that says, through `isLevelEnabled('debug')`, that it
 * wants them, so `console` keeps receiving notices alone.
 */
export function parseLogger(path: string, value: unknown): RouterLogger {
  if (value === undefined) return PROCESS_WARNINGS;
  if (value === false) return SILENT;
  if (typeof (value as { warn?: unknown } | null)?.warn !== 'function') {
    fail(path, `must have a warn(message) method, got ${shown(value)}`, 'Pass e.g. `logger: pino()`, `logger: console`, or `false`.');
  }
  const logger = value as Logger & Record<string, unknown>;
  for (const level of LEVELS) {
    if (logger[level] !== undefined && typeof logger[level] !== 'function') {
      fail(pathOf(path, level), `must be a method when present, got ${shown(logger[level])}`, 'Pass a pino logger, `console`, or an object with `warn(message)`.');
    }
  }
  if (logger.isLevelEnabled !== undefined && typeof logger.isLevelEnabled !== 'function') {
    fail(pathOf(path, 'isLevelEnabled'), `must be a method when present, got ${shown(logger.isLevelEnabled)}`, "Pass a pino logger, or leave `isLevelEnabled` out.");
  }
  // Called through the logger each time: pino swaps a level's method for a no-op and back
  // when its level changes (`logger.level = 'debug'`), and asked per line, the check costs a
  // property lookup when debug is off.
  const hasDebug = typeof logger.debug === 'function' && typeof logger.isLevelEnabled === 'function';
  const debugOn = () => hasDebug && logger.isLevelEnabled!('debug');

  return {
    perRequest: hasDebug,
    warn: (message) => logger.warn(message),
    error: (fields, message) => (logger.error === undefined ? logger.warn(message) : logger.error(fields, message)),
    info: (fields, message) => logger.info?.(fields, message),
    decided(endpoint, source, policy, hintOutcome) {
      if (!debugOn()) return;
      logger.debug!({ dpRank: { upstream: endpoint.upstream, rank: rankOf(endpoint), source }, policy, hintOutcome }, 'express-dp-router: routed');
    },
    retried(failed, next) {
      if (!debugOn()) return;
      logger.debug!(
        { dpRank: { upstream: next.upstream, rank: rankOf(next) }, failed: { upstream: failed.upstream, rank: rankOf(failed) } },
        'express-dp-router: retrying on another endpoint',
      );
    },
    ejected(endpoint) {
      logger.info?.({ dpRank: { upstream: endpoint.upstream, rank: rankOf(endpoint) } }, 'express-dp-router: endpoint ejected after consecutive failures');
    },
    healthChanged(upstream, ranks, healthy, why) {
      const message = healthLine(upstream, ranks, healthy, why);
      // A notice takes a message alone (`warn(message)`), so the upstream and ranks are in its text.
      if (!healthy) logger.warn(message);
      else logger.info?.({ dpRank: { upstream, ranks } }, message);
    },
    decodeOnly(message, fellBack, fields = {}) {
      if (fellBack) logger.warn(message);
      else logger.info?.(fields, message);
    },
  };
}

/** An endpoint's rank as logged: `'vllm'` where vLLM picks the engine (a negative rank, `NO_RANK`). */
function rankOf(endpoint: Endpoint): number | 'vllm' {
  return endpoint.rank < 0 ? 'vllm' : endpoint.rank;
}
