import { integerOption, MAX_TIMER_MS, numberOption, pathOf, toggle, type KeysEnum } from '../option-checks';

/**
 * Engine load from vLLM's own `/metrics` (`vllm:num_requests_running` + `vllm:num_requests_waiting`
 * per `engine`), so that several gateway replicas balance on the load all of them put on each
 * engine, not only their own share.
 */
export interface LoadFeedbackOptions {
  /** Time between polls of each upstream. Default: `1_000` ms. */
  intervalMs?: number;
  /** A poll not answered in full by then fails (a deadline: a page trickled byte by byte cannot hold it); the endpoints fall back to local counts. Default: `1_000` ms. */
  timeoutMs?: number;
  /**
   * How much of the load other gateways put on an engine (engine-reported minus this
   * router's own in-flight) is added to the local count, from 0 to 1. Below 1 because every
   * replica acts on the same stale snapshot: at full weight they all pile onto the engine
   * that looked idlest. Default: `0.5`.
   */
  weight?: number;
}

/**
 * An upstream's rank discovery: its global ranks learned from the distinct `engine` labels of
 * its `/metrics` (start rank = the smallest), at start and every `intervalMs`. A poll without
 * an answer within `loadFeedback.timeoutMs` (`2_000` ms when load feedback is off) fails, and
 * the configured ranks stand.
 */
export interface DiscoverOptions {
  /** Time between polls. Default: `10_000` ms. */
  intervalMs?: number;
}

/** `loadFeedback`, resolved. */
export interface LoadFeedbackConfig {
  readonly intervalMs: number;
  readonly timeoutMs: number;
  readonly weight: number;
}

const LOAD_FEEDBACK_INTERVAL_MS = 1_000;
const LOAD_FEEDBACK_TIMEOUT_MS = 1_000;
const LOAD_FEEDBACK_WEIGHT = 0.5;
const DISCOVER_INTERVAL_MS = 10_000;
/** How long a discovery poll may take when load feedback, which sets its own, is off. */
export const DISCOVER_TIMEOUT_MS = 2_000;
/** Polls more often than this would load the engine's `/metrics` for nothing. */
const MIN_POLL_INTERVAL_MS = 10;

const LOAD_FEEDBACK_KEYS: KeysEnum<LoadFeedbackOptions> = { intervalMs: true, timeoutMs: true, weight: true };
const DISCOVER_KEYS: KeysEnum<DiscoverOptions> = { intervalMs: true };

/** `loadFeedback`: `undefined` when off (the default). */
export function parseLoadFeedback(path: string, value: unknown): LoadFeedbackConfig | undefined {
  const feedback = toggle(path, value, LOAD_FEEDBACK_KEYS, false, 'intervalMs');
  if (feedback === undefined) return undefined;
  return {
    intervalMs: integerOption(pathOf(path, 'intervalMs'), feedback.intervalMs, LOAD_FEEDBACK_INTERVAL_MS, MIN_POLL_INTERVAL_MS, MAX_TIMER_MS),
    timeoutMs: integerOption(pathOf(path, 'timeoutMs'), feedback.timeoutMs, LOAD_FEEDBACK_TIMEOUT_MS, 1, MAX_TIMER_MS),
    weight: numberOption(pathOf(path, 'weight'), feedback.weight, LOAD_FEEDBACK_WEIGHT, 0, 1),
  };
}

/** An upstream's `discover`: its poll interval, `undefined` when off (the default). */
export function parseDiscover(path: string, value: unknown): number | undefined {
  const discover = toggle(path, value, DISCOVER_KEYS, false, 'intervalMs');
  if (discover === undefined) return undefined;
  return integerOption(pathOf(path, 'intervalMs'), discover.intervalMs, DISCOVER_INTERVAL_MS, MIN_POLL_INTERVAL_MS, MAX_TIMER_MS);
}

