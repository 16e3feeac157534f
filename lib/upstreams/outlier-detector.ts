import type { IncomingMessage } from 'node:http';
import type { Circuit, EndpointTable, RouteEndpoint, UpstreamServer } from './endpoints';
import { hashString } from '../hash';
import { NO_METRICS, type RouterMetrics } from '../observe/metrics';
import type { OutlierDetectionConfig } from './outlier-detector-options';
import { evidenceSource } from '../verdicts/source';
import type { Verdicts } from '../verdicts/verdicts';

/**
 * What a failure is evidence of, in Envoy's split of local-origin and external-origin errors:
 *
 * - `connection`: the connection failed before any answer (refused, unreachable, connect
 *   timeout, reset before the response began). Nothing a client sent can cause it, and it
 *   is about the server, which every rank behind that URL shares.
 * - `request`: the server was reached and this request failed there (a 5xx answer, no answer
 *   within the first-byte timeout, an answer cut short). A client's own input can provoke it,
 *   so it counts against the one endpoint, and only failures of several clients eject.
 */
export type FailureOrigin = 'connection' | 'request';

/**
 * Passive outlier detection on two circuits, each Envoy-style: consecutive failures eject for a
 * cool-down, then exactly one trial request is let through (half-open); its success closes the
 * circuit, its failure ejects again for twice as long, up to `maxEjectionMs`.
 *
 * - **Servers** (connection failures): `consecutiveFailures` failed connections in a row to one
 *   URL, on any of its ranks, eject all its endpoints together; any answer from it resets the
 *   count. A server that refuses connections serves no one, so no cap applies: with every
 *   server out, requests get a 503 at once instead of a 502 each after a failed connect.
 * - **Endpoints** (request failures): `consecutiveFailures` failures in a row on one endpoint
 *   eject it only if they came from at least `minimumClients` distinct clients (a verdict for
 *   everyone, lib/verdicts: a client is the request's tenant as admission resolves it, else its
 *   credentials, else `req.ip`, which follows Express's `trust proxy`, else the socket's
 *   address; IPv6 by its /64), so that no single client can evict capacity with requests that
 *   make the engine fail. A run that reaches the count from fewer is counted as refused. At most
 *   `maxEjectionPercent` of the endpoints are ejected this way at once (rounded down, at least
 *   one), and never the last endpoint in rotation: a server that answers, even with errors,
 *   gives a truer answer than a blanket 503.
 *
 * An endpoint is in rotation (`dp_router_endpoint_healthy` 1) exactly when both its circuits and
 * its health check let it be: nothing routes to an endpoint reported down.
 */
export class OutlierDetector {
  /** Endpoints ejected (or half-open, or on trial) by their own circuit. */
  private underEjection = 0;
  private readonly timers = new Set<NodeJS.Timeout>();
  private closed = false;

  constructor(
    private readonly table: EndpointTable,
    private readonly config: OutlierDetectionConfig,
    private readonly metrics: Pick<RouterMetrics, 'ejected'> = NO_METRICS,
    /** Where an ejection by request failures is counted and logged as a verdict. Default: none. */
    private readonly verdicts?: Verdicts,
  ) {}

  /** Read from the table as it is now: `setUpstreams()` and discovery change its size. */
  private get maxUnderEjection(): number {
    const { maxEjectionPercent } = this.config;
    return maxEjectionPercent === 0 ? 0 : Math.max(1, Math.floor((this.table.all.length * maxEjectionPercent) / 100));
  }

  /**
   * A request is being sent to `endpoint`. When its server or the endpoint is half-open this
   * request becomes the trial: what waits for it leaves rotation until the trial decides.
   * Returns whether it did.
   */
  dispatched(endpoint: RouteEndpoint, owner: object): boolean {
    const server = endpoint.server;
    const circuit = endpoint.circuit;
    if (server.state !== 'half-open' && circuit.state !== 'half-open') return false;
    if (server.state === 'half-open') {
      server.state = 'trial';
      server.trialOwner = owner;
      this.table.updateServerHealth(server);
    }
    if (circuit.state === 'half-open') {
      circuit.state = 'trial';
      circuit.trialOwner = owner;
      this.table.updateHealth(endpoint);
    }
    return true;
  }

  /** The endpoint answered (any status below 500). */
  succeeded(endpoint: RouteEndpoint): void {
    this.reached(endpoint.server);
    const circuit = endpoint.circuit;
    if (circuit.consecutiveFailures === 0 && circuit.state === 'closed') return;
    circuit.consecutiveFailures = 0;
    circuit.failingClients.length = 0;
    // A late answer to a request sent before the ejection does not cut the cool-down short.
    if (circuit.state === 'ejected') return;
    if (circuit.state !== 'closed') {
      circuit.close();
      this.underEjection--;
      this.table.updateHealth(endpoint);
    }
  }

  /**
   * The exchange failed in a way that is the upstream's fault (never a 4xx, never a client
   * leaving). `req` (and its `tenant`, as admission resolved it) names the client, for request failures.
   */
  failed(endpoint: RouteEndpoint, origin: FailureOrigin, req?: IncomingMessage, tenant?: string): void {
    if (origin === 'connection') {
      this.connectionFailed(endpoint.server);
      return;
    }
    // The server took the connection: whatever went wrong, it is up.
    this.reached(endpoint.server);
    const circuit = endpoint.circuit;
    switch (circuit.state) {
      case 'closed':
        circuit.consecutiveFailures++;
        this.noteClient(circuit, req, tenant);
        if (circuit.consecutiveFailures < this.config.consecutiveFailures) return;
        const evidence = { rank: endpoint.rank, failures: circuit.consecutiveFailures, sources: circuit.failingClients.length };
        if (circuit.failingClients.length >= this.config.minimumClients) {
          if (this.tryEject(endpoint)) this.verdicts?.taken(endpoint.upstream, 'ejection', 'sources', evidence);
        } else if (circuit.consecutiveFailures === this.config.consecutiveFailures) {
          this.verdicts?.refused(endpoint.upstream, 'ejection', evidence);
        }
        return;
      case 'half-open':
      case 'trial':
        // The trial (or a request still in flight from before) failed: back out, for longer.
        this.eject(circuit, () => this.table.updateHealth(endpoint));
        return;
      case 'ejected':
        // Requests sent before the ejection finishing late say nothing new.
        return;
    }
  }

  /** The trial request ended without a verdict (the client left first): let another request try. */
  abandoned(endpoint: RouteEndpoint, owner: object): void {
    const server = endpoint.server;
    if (server.state === 'trial' && server.trialOwner === owner) {
      server.state = 'half-open';
      server.trialOwner = undefined;
      this.table.updateServerHealth(server);
    }
    const circuit = endpoint.circuit;
    if (circuit.state === 'trial' && circuit.trialOwner === owner) {
      circuit.state = 'half-open';
      circuit.trialOwner = undefined;
      this.table.updateHealth(endpoint);
    }
  }

  /** Stops the cool-down timers. Ejected endpoints stay as they are. */
  close(): void {
    this.closed = true;
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
  }

  /** An answer, or a request failure after the connection was taken: the server is up. */
  private reached(server: UpstreamServer): void {
    if (server.consecutiveFailures === 0 && server.state === 'closed') return;
    server.consecutiveFailures = 0;
    if (server.state === 'ejected') return;
    if (server.state !== 'closed') {
      server.close();
      this.table.updateServerHealth(server);
    }
  }

  private connectionFailed(server: UpstreamServer): void {
    switch (server.state) {
      case 'closed':
        if (++server.consecutiveFailures >= this.config.consecutiveFailures) this.eject(server, () => this.table.updateServerHealth(server));
        return;
      case 'half-open':
      case 'trial':
        this.eject(server, () => this.table.updateServerHealth(server));
        return;
      case 'ejected':
        return;
    }
  }

  /** Keeps up to `minimumClients` distinct client hashes of the current failure run. */
  private noteClient(circuit: Circuit, req: IncomingMessage | undefined, tenant: string | undefined): void {
    const clients = circuit.failingClients;
    if (clients.length >= this.config.minimumClients) return;
    const client = hashString(req === undefined ? '' : evidenceSource(req, req.headers, tenant));
    if (!clients.includes(client)) clients.push(client);
  }

  private tryEject(endpoint: RouteEndpoint): boolean {
    if (this.closed || this.underEjection >= this.maxUnderEjection) return false;
    if (endpoint.healthy && this.table.healthyCount <= 1) return false;
    this.underEjection++;
    this.eject(endpoint.circuit, () => this.table.updateHealth(endpoint));
    return true;
  }

  /** Opens the circuit for its cool-down, then makes it half-open; `changed` updates rotation. */
  private eject(circuit: Circuit, changed: () => void): void {
    if (this.closed) return;
    clearTimeout(circuit.coolDown);
    if (circuit.coolDown !== undefined) this.timers.delete(circuit.coolDown);
    circuit.state = 'ejected';
    circuit.trialOwner = undefined;
    circuit.consecutiveFailures = 0;
    circuit.failingClients.length = 0;
    const coolDown = Math.min(this.config.baseEjectionMs * 2 ** Math.min(circuit.ejections, 30), this.config.maxEjectionMs);
    circuit.ejections++;
    // A server's ejection takes out each of its endpoints: each rank counts one (its balanced
    // endpoint, out with it, counts only ejections of its own).
    for (const endpoint of this.table.metered) if (endpoint.circuit === circuit || (endpoint.server === circuit && !endpoint.balanced)) this.metrics.ejected(endpoint);
    changed();
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      // Closed meanwhile (a passing health check), and perhaps ejected anew: not this cool-down's to end.
      if (circuit.coolDown !== timer) return;
      circuit.coolDown = undefined;
      if (circuit.state !== 'ejected') return;
      circuit.state = 'half-open';
      changed();
    }, coolDown);
    timer.unref();
    circuit.coolDown = timer;
    this.timers.add(timer);
  }
}

/** Who sent the request, as a client counts for ejection (verdicts/source.ts). */
export { clientOf } from '../verdicts/source';
