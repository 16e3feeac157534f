import { smallRequest } from '../http/small-http';
import type { EndpointTable, RouteEndpoint } from './endpoints';
import type { HealthCheckConfig } from './health-checker-options';

/** The probes of one router; `stop()` ends timers and probes in flight. */
export interface HealthChecker {
  stop(): void;
}

interface Target {
  readonly url: string;
  readonly endpoints: RouteEndpoint[];
  up: boolean;
  failures: number;
  successes: number;
  timer: NodeJS.Timeout | undefined;
  probe: AbortController | undefined;
}

/** A probe passes on any 2xx answer read to its end. */
const passes = (status: number) => status >= 200 && status < 300;

/** Told once per verdict change of an upstream URL, with the endpoints behind it. */
export type HealthChange = (endpoints: readonly RouteEndpoint[], up: boolean) => void;

/**
 * Probes `GET <url><path>` of every distinct upstream URL, one probe at a time per URL, the
 * next one `intervalMs` after the previous ended. All ranks an upstream serves share its
 * verdict: vLLM's `/health` answers for the whole server. Upstreams start in rotation, so that
 * a router does not answer 503 while its first probes run. Timers are unref'd: probes never
 * keep a process alive.
 */
export function startHealthChecks(table: EndpointTable, config: HealthCheckConfig, changed: HealthChange = () => undefined): HealthChecker {
  const targets = new Map<string, Target>();
  // Balanced endpoints too: the requests vLLM balances need a server that is up.
  for (const endpoint of table.metered) {
    const url = endpoint.config.url;
    let target = targets.get(url);
    if (target === undefined) {
      // Restarted after a reconfiguration, a server keeps the verdict it had.
      target = { url, endpoints: [], up: endpoint.probeUp, failures: 0, successes: 0, timer: undefined, probe: undefined };
      targets.set(url, target);
    }
    target.endpoints.push(endpoint);
    if (endpoint.probeUp !== target.up) {
      endpoint.probeUp = target.up;
      table.updateHealth(endpoint);
    }
  }
  let stopped = false;

  const schedule = (target: Target, delay: number) => {
    if (stopped) return;
    target.timer = setTimeout(() => probe(target), delay);
    target.timer.unref();
  };

  const record = (target: Target, passed: boolean) => {
    target.probe = undefined;
    if (stopped) return;
    if (passed) {
      // The server took a connection and answered: failed connections no longer speak against it.
      const server = table.server(target.url);
      if (server !== undefined && server.state !== 'closed') {
        server.close();
        table.updateServerHealth(server);
      }
      target.failures = 0;
      target.successes++;
      if (!target.up && target.successes >= config.healthyThreshold) setUp(target, true);
    } else {
      target.successes = 0;
      target.failures++;
      if (target.up && target.failures >= config.unhealthyThreshold) setUp(target, false);
    }
    schedule(target, config.intervalMs);
  };

  const setUp = (target: Target, up: boolean) => {
    target.up = up;
    for (const endpoint of target.endpoints) {
      endpoint.probeUp = up;
      table.updateHealth(endpoint);
    }
    changed(target.endpoints, up);
  };

  const probe = (target: Target) => {
    target.timer = undefined;
    if (stopped) return;
    const abort = (target.probe = new AbortController());
    // A fresh connection per probe: a server that stopped accepting must fail the probe, not
    // pass it over a kept-alive socket.
    smallRequest(`${target.url}${config.path}`, { deadlineMs: config.timeoutMs, maxBytes: 0, drain: true, connection: 'fresh', accept: passes, signal: abort.signal }).then(
      () => record(target, true),
      () => record(target, false),
    );
  };

  for (const target of targets.values()) schedule(target, 0);

  return {
    stop() {
      stopped = true;
      for (const target of targets.values()) {
        clearTimeout(target.timer);
        target.timer = undefined;
        target.probe?.abort();
        target.probe = undefined;
      }
    },
  };
}
