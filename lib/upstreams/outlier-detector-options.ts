import { fail, integerOption, MAX_TIMER_MS, numberOption, pathOf, toggle, type KeysEnum } from '../option-checks';

/**
 * Passive outlier detection (Envoy's name), on two kinds of evidence:
 *
 * - **Connection failures** (refused, unreachable, connect timeout, reset before any answer)
 *   are about the server: `consecutiveFailures` of them in a row to one upstream URL take every
 *   rank behind it out of rotation together. No cap: with every server out, the router answers
 *   503 at once.
 * - **Request failures** (a 5xx answer, a first-byte timeout, an answer cut short) may be
 *   provoked by the request itself: `consecutiveFailures` in a row take one endpoint out only
 *   when they came from at least `minimumClients` distinct clients, and at most
 *   `maxEjectionPercent` of the endpoints at once.
 *
 * Out of rotation is a cool-down, then half-open: one trial request decides whether the server
 * or endpoint comes back (a passing active health check also brings a server back). A 4xx
 * answer is the request's fault, never the endpoint's, and counts as a success like any answer
 * below 500.
 */
export interface OutlierDetectionOptions {
  /** Consecutive failures that eject a server (connection failures) or an endpoint (request failures). Default: `5`. */
  consecutiveFailures?: number;
  /** The first cool-down; it doubles for each ejection in a row, up to `maxEjectionMs`. Default: `10_000` ms. */
  baseEjectionMs?: number;
  /** The longest cool-down. Default: `300_000` ms, or `baseEjectionMs` when that is longer. */
  maxEjectionMs?: number;
  /**
   * For request failures only: at most this share of the router's endpoints is ejected at once
   * (rounded down, at least one endpoint), and never the last endpoint in rotation: a server
   * that still answers gives its own error rather than a blanket 503. Connection failures are
   * not capped. Default: `50`.
   */
  maxEjectionPercent?: number;
  /**
   * For request failures only: the distinct clients whose requests must be among a failure run
   * before it ejects an endpoint, so that one client cannot evict capacity for everyone with
   * requests that make the engine fail. A client is `req.ip` (Express's, which follows your
   * app's `trust proxy` setting: set it behind a load balancer, or every request is the
   * balancer's), else the socket's address; an IPv6 client counts by its /64. `1` counts
   * failures from anyone. Default: `3`.
   */
  minimumClients?: number;
}

/** `outlierDetection`, resolved. */
export interface OutlierDetectionConfig {
  readonly consecutiveFailures: number;
  readonly baseEjectionMs: number;
  readonly maxEjectionMs: number;
  readonly maxEjectionPercent: number;
  readonly minimumClients: number;
}

const CONSECUTIVE_FAILURES = 5;
const BASE_EJECTION_MS = 10_000;
const MAX_EJECTION_MS = 300_000;
const MAX_EJECTION_PERCENT = 50;
const MINIMUM_CLIENTS = 3;

const OUTLIER_DETECTION_KEYS: KeysEnum<OutlierDetectionOptions> = {
  consecutiveFailures: true,
  baseEjectionMs: true,
  maxEjectionMs: true,
  maxEjectionPercent: true,
  minimumClients: true,
};

/** `outlierDetection`: on by default, `undefined` when off. */
export function parseOutlierDetection(path: string, value: unknown): OutlierDetectionConfig | undefined {
  const outlier = toggle(path, value, OUTLIER_DETECTION_KEYS, true, 'consecutiveFailures');
  if (outlier === undefined) return undefined;
  const baseEjectionMs = integerOption(pathOf(path, 'baseEjectionMs'), outlier.baseEjectionMs, BASE_EJECTION_MS, 1, MAX_TIMER_MS);
  // A longer base cool-down than the default longest one raises the longest with it.
  const maxEjectionMs = integerOption(pathOf(path, 'maxEjectionMs'), outlier.maxEjectionMs, Math.max(MAX_EJECTION_MS, baseEjectionMs), 1, MAX_TIMER_MS);
  if (maxEjectionMs < baseEjectionMs) {
    fail(pathOf(path, 'maxEjectionMs'), `is ${maxEjectionMs}, below baseEjectionMs (${baseEjectionMs})`, 'Make it at least `baseEjectionMs`, or leave it out.');
  }
  return {
    consecutiveFailures: integerOption(pathOf(path, 'consecutiveFailures'), outlier.consecutiveFailures, CONSECUTIVE_FAILURES, 1, 1_000_000),
    baseEjectionMs,
    maxEjectionMs,
    maxEjectionPercent: numberOption(pathOf(path, 'maxEjectionPercent'), outlier.maxEjectionPercent, MAX_EJECTION_PERCENT, 0, 100),
    minimumClients: integerOption(pathOf(path, 'minimumClients'), outlier.minimumClients, MINIMUM_CLIENTS, 1, 1000),
  };
}
