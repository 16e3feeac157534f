import { fail, integerOption, MAX_TIMER_MS, pathOf, shown, toggle, type KeysEnum } from '../option-checks';

/**
 * Active health checks: one `GET` of each upstream URL's `path` per interval, shared by all
 * the ranks it serves. An upstream that fails `unhealthyThreshold` probes in a row (no answer
 * within `timeoutMs`, or a status other than 2xx) has all its endpoints taken out of rotation
 * until `healthyThreshold` probes in a row succeed.
 */
export interface HealthCheckOptions {
  /** The path probed. Default: `'/health'` (vLLM's). */
  path?: string;
  /** Time between the end of one probe and the start of the next. Default: `5_000` ms. */
  intervalMs?: number;
  /** A probe without an answer by then fails. Default: `2_000` ms. */
  timeoutMs?: number;
  /** Failed probes in a row that take an upstream out. Default: `2`. */
  unhealthyThreshold?: number;
  /** Passed probes in a row that bring it back. Default: `1`. */
  healthyThreshold?: number;
}

/** `healthCheck`, resolved. */
export interface HealthCheckConfig {
  readonly path: string;
  readonly intervalMs: number;
  readonly timeoutMs: number;
  readonly unhealthyThreshold: number;
  readonly healthyThreshold: number;
}

const PATH = '/health';
const INTERVAL_MS = 5_000;
const TIMEOUT_MS = 2_000;
const UNHEALTHY_THRESHOLD = 2;
const HEALTHY_THRESHOLD = 1;

const HEALTH_CHECK_KEYS: KeysEnum<HealthCheckOptions> = { path: true, intervalMs: true, timeoutMs: true, unhealthyThreshold: true, healthyThreshold: true };

/** `healthCheck`: `undefined` when off (the default). */
export function parseHealthCheck(path: string, value: unknown): HealthCheckConfig | undefined {
  const check = toggle(path, value, HEALTH_CHECK_KEYS, false, 'intervalMs');
  if (check === undefined) return undefined;
  const probed = check.path ?? PATH;
  // The path is joined to every upstream URL: no scheme, host, whitespace or control characters.
  if (typeof probed !== 'string' || !/^\/[\x21-\x7e]*$/.test(probed)) {
    fail(pathOf(path, 'path'), `must be a path starting with '/', got ${shown(check.path)}`, `Use e.g. \`path: '${PATH}'\`.`);
  }
  return {
    path: probed,
    intervalMs: integerOption(pathOf(path, 'intervalMs'), check.intervalMs, INTERVAL_MS, 1, MAX_TIMER_MS),
    timeoutMs: integerOption(pathOf(path, 'timeoutMs'), check.timeoutMs, TIMEOUT_MS, 1, MAX_TIMER_MS),
    unhealthyThreshold: integerOption(pathOf(path, 'unhealthyThreshold'), check.unhealthyThreshold, UNHEALTHY_THRESHOLD, 1, 1000),
    healthyThreshold: integerOption(pathOf(path, 'healthyThreshold'), check.healthyThreshold, HEALTHY_THRESHOLD, 1, 1000),
  };
}
