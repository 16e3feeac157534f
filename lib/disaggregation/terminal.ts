import { randomUUID } from 'node:crypto';
import type { IncomingHttpHeaders, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { sendError } from '../errors';
import { clientGone, type TryFailure } from '../forward/proxy';
import { setForwardedHeaders } from '../forward/forwarded-headers';
import type { Tracing } from '../observe/tracing';
import type { PrefixPickContext } from '../policies/prefix-aware';
import { hasBody, isJson } from '../http/body';
import { isWebSocketUpgrade, upstreamRequestStripper, type HopByHopStripper } from '../http/hop-by-hop';
import { scanFields } from '../http/json-fields';
import type { BodyView, JudgedHint } from '../request/request-inputs';
import { hintRejection } from '../request/hint-rejection';
import type { BodyReader, Next } from '../request/body-reader';
import type { Terminal } from '../request/lifecycle';
import type { RouteState, RoutedRequest } from '../request/route-state';
import type { PoolTerminal } from '../routing';
import type { EndpointSnapshot } from '../types';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import { checkPools, PREFILL_HINT_HEADER } from './options';
import { decodePool, prefillPool } from '../upstreams/upstream-options';
import type { DisaggregationRouterConfig, PrefillLeg } from './leg-parts';
import type { DecisionSource, PickContext } from '../types';
import type { RouteEndpoint } from '../upstreams/endpoints';
import type { FieldScan } from '../http/json-fields';
import { parseOutOfRange } from '../upstreams/rank-header-check';
import { decodeBody, mooncakeDecodeParams, mooncakePrefillParams, NIXL_PREFILL_PARAMS, prefillBody, scanLegs, transferParamsOf, type RankField } from './leg-bodies';
import type { DisaggregatedOutcome } from './metrics';
import { FallbackLog } from './fallback-log';
import { bootstrapAddress, BootstrapDirectory } from './mooncake';
import type { PrefillResult } from './prefill-client';

/** What the terminal is built from: the router's services (the decode pool's). */
export interface DisaggregationParts {
  readonly config: DisaggregationRouterConfig;
  readonly bodies: BodyReader;
  readonly tracing: Tracing;
}

/** What the prefill leg ended with, when it did not hand the decode leg its parameters. */
type PrefillFailure = TryFailure | 'too_large' | 'status' | 'no_params' | 'unavailable' | 'no_engine';

/** vLLM's error body is far shorter: what is past this is not read for its refusal of the rank header. */
const MAX_REFUSAL_BYTES = 4096;
/** The generation endpoints a prefill leg applies to; everything else goes whole to the decode pool. */
const GENERATION = /\/v1\/(?:chat\/)?completions(?:\?|$)/;
/** What a caller's `X-Request-Id` may be to be kept (it goes into Mooncake's `transfer_id`). */
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;
/**
 * Not copied to the prefill leg, whose request is stripped of hop-by-hop headers already (the
 * decode leg's filter, see {@link DisaggregatedTerminal.split}): the `Connection: keep-alive`
 * left for the agent, the body's framing (set anew), and compression (the answer is read).
 */
const NOT_COPIED = new Set(['connection', 'transfer-encoding', 'expect', 'host', 'content-length', 'accept-encoding']);
const DECISION_HEADER = 'x-dp-router-decision';

/**
 * dpRouter's terminal with `disaggregation`: a generation request is split into a prefill leg,
 * sent here to a prefill rank picked by `prefillPolicy`, and a decode leg, handed to the
 * forwarder at the decode rank the lifecycle picked with `policy` (docs/disaggregation.md). NIXL
 * waits for the prefill answer's `kv_transfer_params`; Mooncake sends both legs at once.
 */
export class DisaggregatedTerminal implements Terminal, PoolTerminal {
  readonly pool: PrefillLeg;
  private readonly config: DisaggregationRouterConfig;
  private readonly tracing: Tracing;
  private readonly bodies: BodyReader;
  private readonly bootstrap: BootstrapDirectory | undefined;
  private readonly rankField: Buffer | undefined;
  private readonly fallbacks: FallbackLog;
  /** The forwarder's hop-by-hop filter, applied once before the legs part, so that both send the same headers. */
  private readonly stripHopByHop: HopByHopStripper;

  constructor(
    parts: DisaggregationParts,
    private readonly decode: Terminal,
    pool: PrefillLeg,
  ) {
    const config = (this.config = parts.config);
    this.bodies = parts.bodies;
    this.tracing = parts.tracing;
    this.pool = pool;
    this.bootstrap = config.disaggregation!.connector === 'mooncake' ? new BootstrapDirectory(config.timeouts.connectMs) : undefined;
    const { bodyField } = config.hints;
    this.rankField = bodyField === undefined ? undefined : Buffer.from(bodyField);
    this.fallbacks = new FallbackLog(config.logger);
    this.stripHopByHop = upstreamRequestStripper(config.header);
  }

  proceed(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    const path = req.originalUrl ?? req.url ?? '/';
    // A WebSocket upgrade goes to the forwarder whole, which answers it 501.
    if (req.method !== 'POST' || !GENERATION.test(path) || isWebSocketUpgrade(route.headers) || (route.body === undefined && (!hasBody(route.headers) || !isJson(route.headers)))) {
      if (req.headers[PREFILL_HINT_HEADER] !== undefined) delete req.headers[PREFILL_HINT_HEADER];
      this.decode.proceed(req, res, next, route);
      return;
    }
    if (route.body !== undefined) {
      this.split(req, res, next, route, path, route.body);
      return;
    }
    this.bodies.read(req, res, route, this.config.maxBodyBytes, 'routing', next, (_req, _res, _next, _route, bytes) => {
      if (bytes !== undefined) this.split(req, res, next, route, path, bytes);
    });
  }

  async close(): Promise<void> {
    this.decode.close();
    await this.pool.close();
  }

  /** The prefill pool's endpoints, each marked `leg: 'prefill'`. */
  snapshot(): EndpointSnapshot[] {
    return this.pool.table.snapshot().map((endpoint) => ({ ...endpoint, leg: 'prefill' }));
  }

  /** `setUpstreams()`: both pools must keep a member; the prefill pool follows here, the decode pool is returned for the services. */
  reconfigure(upstreams: readonly UpstreamConfig[]): readonly UpstreamConfig[] {
    checkPools('upstreams', upstreams);
    this.pool.setSources(prefillPool(upstreams));
    return decodePool(upstreams);
  }

  /** Judges the prefill hint, picks the prefill endpoint, names the request, and starts the connector's legs. */
  private split(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, path: string, bytes: Buffer): void {
    const { config, pool } = this;
    const { trusted } = route;
    // In place, before the request id is read or set: a nominated `X-Request-Id` is the client's
    // connection's, and both legs then carry the same headers (the forwarder's pass finds nothing left).
    this.stripHopByHop(route.headers);
    route.slo?.prefillsElsewhere();
    const verdict = pool.inputs.headerHint(req, trusted);
    if (req.headers[PREFILL_HINT_HEADER] !== undefined) delete req.headers[PREFILL_HINT_HEADER];
    let prefill: RouteEndpoint | undefined;
    let source: DecisionSource = 'assigned';
    if (verdict.outcome !== 'none') pool.metrics.hint(verdict.outcome);
    if (verdict.outcome === 'accepted') {
      prefill = pool.table.leastLoadedOfRank(verdict.rank!);
      source = 'hint';
    } else if (config.hints.onInvalid === 'reject' && verdict.outcome !== 'none' && verdict.outcome !== 'untrusted') {
      this.reject(res, verdict);
      return;
    } else {
      const picked = this.pick(req, res, next, route, path, bytes);
      if (picked === null) return;
      // SLO routing shed it at the prefill pick: no prefill rank, with the decode rank held, meets its objectives.
      if (route.slo?.shed === true) return route.slo.answerShed(res);
      prefill = picked;
    }
    const id = req.headers['x-request-id'];
    const requestId = trusted && typeof id === 'string' && REQUEST_ID.test(id) ? id : randomUUID();
    req.headers['x-request-id'] = requestId;
    if (prefill === undefined) {
      this.prefillFailed(req, res, next, route, bytes, 'unavailable');
      return;
    }
    const decision = config.exposeDecision ? String(res.getHeader(DECISION_HEADER) ?? '') : undefined;
    if (decision !== undefined) res.setHeader(DECISION_HEADER, `${route.slo?.withPairNote(decision) ?? decision}; prefill=${prefill.upstream}@${prefill.rank}`);
    if (this.bootstrap === undefined) this.nixl(req, res, next, route, path, bytes, prefill, source, []);
    else this.mooncake(req, res, next, route, path, bytes, prefill, source, requestId);
  }

  /** The prefill policy's pick among the healthy prefill endpoints; `undefined` when there are none, `null` when answered. */
  private pick(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, path: string, bytes: Buffer, skip?: readonly RouteEndpoint[]): RouteEndpoint | undefined | null {
    const { pool } = this;
    const { policy } = this.pool;
    const candidates = skip === undefined ? pool.table.healthy() : pool.table.healthy().filter((endpoint) => !skip.some((failed) => failed.config.url === endpoint.config.url));
    if (candidates.length === 0) return undefined;
    let view: BodyView | undefined;
    if (policy.usesPrompt || policy.usesAffinityKey) {
      // A body the lifecycle decoded whole already serves the prefill policy too.
      const read = route.view?.members !== undefined ? route.view : pool.inputs.viewOf(bytes, route.lease);
      if (typeof read === 'string') {
        this.answer(res, 400, 'BadRequestError', read);
        return null;
      }
      view = read;
    }
    const prompt = policy.usesPrompt && view !== undefined ? pool.inputs.prompt(view, route.lease) : undefined;
    const affinityKey = policy.usesAffinityKey ? pool.inputs.affinityKey(req, view, route.lease) : undefined;
    const context: PickContext = { path, affinityKey, prompt };
    const exact = prompt !== undefined && skip === undefined ? pool.exact?.lookupRequest(path, bytes, candidates, view?.members) : undefined;
    // With `slo`, a first pick is steered to the prefill rank that, with the decode rank held, meets the objectives.
    const slo = skip === undefined ? route.slo?.prefillSteer() : undefined;
    const picking: PrefixPickContext = { ...context, ...(exact !== undefined && { exact }), ...(slo !== undefined && { slo }) };
    try {
      const chosen = policy.pick(candidates, picking).endpoint;
      if (candidates.includes(chosen)) return chosen;
      next(new TypeError(`express-dp-router: policy '${policy.name}' returned an endpoint that was not among the candidates.`));
    } catch (error) {
      // A retry answers the prefill's failure instead; the policy's fault surfaces on first picks.
      if (skip !== undefined) return undefined;
      next(error);
    }
    return null;
  }

  /** NIXL: the prefill answer's `kv_transfer_params` go to the decode leg; a failed connection is retried on another prefill server. */
  private nixl(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, path: string, bytes: Buffer, prefill: RouteEndpoint, source: DecisionSource, tried: RouteEndpoint[]): void {
    const rankField = this.rankFieldFor(route, prefill);
    // One scan of the client's body makes both legs' bodies.
    const scan = scanLegs(bytes, rankField);
    const body = prefillBody(bytes, NIXL_PREFILL_PARAMS, rankField, scan);
    if (body === undefined) {
      this.answer(res, 400, 'BadRequestError', 'Request body must be a JSON object.');
      return;
    }
    this.sendPrefill(req, res, route, path, prefill, source, body).then((result) => {
      if (res.destroyed) {
        this.cancelledDuringPrefill(prefill, result);
        return;
      }
      const judged = this.judge(req, route, prefill, result);
      if (typeof judged === 'object') {
        // The prefill keeps the blocks for kv_lease_duration from now, unless the decode engine renews it.
        route.leaseEnds = performance.now() + this.config.disaggregation!.kvLeaseMs;
        this.decodeWith(req, res, next, route, bytes, judged.params, 'disaggregated', scan);
        return;
      }
      const failure = judged;
      if ((failure === 'refused' || failure === 'connect_timeout' || failure === 'reset') && tried.length + 1 < this.config.retries.attempts) {
        tried.push(prefill);
        const again = source === 'hint' ? this.pool.table.leastLoadedOfRank(prefill.rank, (endpoint) => tried.some((failed) => failed.config.url === endpoint.config.url)) : this.pick(req, res, next, route, path, bytes, tried);
        if (again !== undefined && again !== null) {
          this.pool.events.retried(req, prefill, again);
          this.nixl(req, res, next, route, path, bytes, again, source, tried);
          return;
        }
      }
      this.prefillFailed(req, res, next, route, bytes, failure, prefill);
    }, next);
  }

  /** Mooncake: the decode leg names the prefill rank's engine and a shared `transfer_id`; both legs go at once. */
  private mooncake(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, path: string, bytes: Buffer, prefill: RouteEndpoint, source: DecisionSource, requestId: string): void {
    this.bootstrap!.engineOf(prefill.config, prefill.rank).then((engineId) => {
      if (res.destroyed) {
        this.pool.legMetrics?.cancelled('prefill');
        return;
      }
      if (engineId === undefined) {
        this.prefillFailed(req, res, next, route, bytes, 'no_engine', prefill);
        return;
      }
      const transferId = `xfer-${requestId}`;
      const rankField = this.rankFieldFor(route, prefill);
      const scan = scanLegs(bytes, rankField);
      const body = prefillBody(bytes, mooncakePrefillParams(transferId), rankField, scan);
      if (body === undefined) {
        this.answer(res, 400, 'BadRequestError', 'Request body must be a JSON object.');
        return;
      }
      this.sendPrefill(req, res, route, path, prefill, source, body).then((result) => {
        // The decode leg is on its way whatever this says: it is counted, not acted on.
        if (!clientGone(res)) this.judge(req, route, prefill, result);
      }, next);
      this.decodeWith(req, res, next, route, bytes, mooncakeDecodeParams(transferId, bootstrapAddress(prefill.config), engineId), 'disaggregated', scan);
    }, next);
  }

  /** Sends the prefill leg, holding the endpoint's slot until it settles; a client that leaves aborts it. */
  private sendPrefill(req: RoutedRequest, res: ServerResponse, route: RouteState, path: string, prefill: RouteEndpoint, source: DecisionSource, body: Buffer): Promise<PrefillResult> {
    const { pool } = this;
    prefill.inflight++;
    pool.metrics.dispatched(prefill, source);
    this.tracing.legSent(req, 'prefill', prefill);
    const trial = pool.detector?.dispatched(prefill, res) === true;
    const started = performance.now();
    const call = pool.clientOf(prefill).post(path, this.prefillHeaders(req, prefill), body);
    const abort = () => call.abort();
    res.once('close', abort);
    return call.result.then((result) => {
      res.off('close', abort);
      prefill.inflight--;
      const seconds = (performance.now() - started) / 1000;
      pool.metrics.finished(prefill, seconds);
      pool.legMetrics?.prefilled(prefill, seconds);
      route.slo?.prefilled(prefill, seconds, result.ok && result.status >= 200 && result.status < 300);
      if (trial && res.destroyed) pool.detector!.abandoned(prefill, res);
      return result;
    });
  }

  /** Counts the prefill's answer against its endpoint: the `kv_transfer_params` it handed over (Mooncake's need none), or the failure. */
  private judge(req: RoutedRequest, route: RouteState, prefill: RouteEndpoint, result: PrefillResult): PrefillFailure | { params: string | undefined } {
    const { pool } = this;
    if (!result.ok) {
      const kind = result.failure === 'refused' ? 'connect' : result.failure === 'reset' || result.failure === 'too_large' ? 'reset' : 'timeout';
      pool.metrics.upstreamError(prefill, kind);
      pool.detector?.failed(prefill, result.failure === 'first_byte_timeout' || result.failure === 'too_large' ? 'request' : 'connection', req);
      return result.failure;
    }
    if (result.status >= 500) {
      pool.metrics.upstreamError(prefill, 'status_5xx');
      pool.detector?.failed(prefill, 'request', req);
      return 'status';
    }
    pool.detector?.succeeded(prefill);
    if (result.status === 400 && prefill.headerValue !== undefined) {
      // vLLM's refusal of the header (rank-rejection.ts): the guard takes the server's ranks out of the prefill pool's rotation.
      const refused = parseOutOfRange(result.body.subarray(0, MAX_REFUSAL_BYTES).toString('utf8'));
      if (refused !== undefined) pool.rankHeaders.refused(prefill, refused.rank, refused.numRanks, req, route.headers, route.ticket?.tenant);
    }
    if (result.status < 200 || result.status >= 300) return 'status';
    if (this.bootstrap !== undefined) return { params: undefined };
    const params = transferParamsOf(result.body);
    return params === undefined ? 'no_params' : { params };
  }

  /** The prefill leg (at `prefill`, when one was tried) failed: decode alone serves (`'decode-only'`), or the gateway answers (`'fail'`). */
  private prefillFailed(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, bytes: Buffer, failure: PrefillFailure, prefill?: RouteEndpoint): void {
    if (this.config.disaggregation!.onPrefillFailure === 'decode-only') {
      this.fallbacks.fellBack(failure, PREFILL_FAILURES[failure], prefill?.upstream);
      this.decodeWith(req, res, next, route, bytes, undefined, 'decode_only');
      return;
    }
    if (failure === 'unavailable') this.answer(res, 503, 'ServiceUnavailableError', PREFILL_FAILURES[failure]);
    else if (failure === 'connect_timeout' || failure === 'timeout' || failure === 'first_byte_timeout') this.answer(res, 504, 'GatewayTimeoutError', PREFILL_FAILURES[failure]);
    else this.answer(res, 502, 'BadGatewayError', PREFILL_FAILURES[failure]);
  }

  /** The decode leg: the client's body with `params` (or none), to the decode endpoint the request holds. */
  private decodeWith(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, bytes: Buffer, params: string | undefined, outcome: DisaggregatedOutcome, scan?: FieldScan): void {
    const body = decodeBody(bytes, params, scan);
    if (body === undefined) {
      this.answer(res, 400, 'BadRequestError', 'Request body must be a JSON object.');
      return;
    }
    if (body !== bytes) {
      route.body = body;
      req.headers['content-length'] = String(body.length);
      if (req.headers['transfer-encoding'] !== undefined) delete req.headers['transfer-encoding'];
      // A retry of the decode leg rewrites the hint field where it now is.
      if (route.hintFields !== undefined) {
        const scan = scanFields(body, [this.rankField!]);
        route.hintFields = scan.ok ? scan.fields[0] : undefined;
      }
    }
    this.pool.legMetrics?.outcome(outcome);
    if (outcome === 'disaggregated') this.fallbacks.succeeded();
    this.tracing.legSent(req, 'decode', route.endpoint!);
    const legMetrics = this.pool.legMetrics;
    if (legMetrics !== undefined) res.once('close', () => clientGone(res) && legMetrics.cancelled('decode'));
    this.decode.proceed(req, res, next, route);
  }

  /** The client left while the prefill was in flight: no decode leg; blocks kept for it are stranded. */
  private cancelledDuringPrefill(prefill: RouteEndpoint, result: PrefillResult): void {
    const legMetrics = this.pool.legMetrics;
    legMetrics?.cancelled('prefill');
    if (result.ok && result.status < 300 && transferParamsOf(result.body) !== undefined) legMetrics?.stranded(prefill);
  }

  /** The prefill leg's headers: the client's end-to-end ones, the prefill rank, the shared request id. */
  private prefillHeaders(req: RoutedRequest, prefill: RouteEndpoint): OutgoingHttpHeaders {
    const headers: OutgoingHttpHeaders = {};
    const source = req.headers;
    for (const name in source) if (!NOT_COPIED.has(name)) headers[name] = source[name];
    // As the decode leg gets them from the forwarder: never the client's own under `xfwd: true`.
    const { xfwd } = this.config;
    if (xfwd !== false) setForwardedHeaders(headers as IncomingHttpHeaders, source.host, req.socket, xfwd === 'replace');
    const { header } = this.config;
    if (prefill.headerValue !== undefined) headers[header] = prefill.headerValue;
    else delete headers[header];
    headers['content-type'] = 'application/json';
    headers['accept-encoding'] = 'identity';
    return headers;
  }

  /** The hint field, when the body carries one, set to the prefill rank in the prefill body. */
  private rankFieldFor(route: RouteState, prefill: RouteEndpoint): RankField | undefined {
    if (this.rankField === undefined || route.hintFields === undefined) return undefined;
    return { name: this.rankField, value: prefill.headerValue ?? 'null' };
  }

  private reject(res: ServerResponse, verdict: JudgedHint): void {
    const answer = hintRejection(verdict, 'prefill', this.pool.table.routableRanks);
    this.answer(res, answer.status, answer.type, answer.message, answer.param);
  }

  /** The gateway's own answer, counted `failed`. */
  private answer(res: ServerResponse, status: number, type: 'BadRequestError' | 'BadGatewayError' | 'ServiceUnavailableError' | 'GatewayTimeoutError', message: string, param: string | null = null): void {
    this.pool.legMetrics?.outcome('failed');
    sendError(res, status, type, message, param);
  }
}

const TOO_SLOW = 'The prefill upstream did not answer in time.';
const PREFILL_FAILURES: Record<PrefillFailure, string> = {
  unavailable: 'No healthy prefill endpoint is available.',
  connect_timeout: TOO_SLOW,
  timeout: TOO_SLOW,
  first_byte_timeout: TOO_SLOW,
  refused: 'The prefill upstream refused the connection.',
  reset: 'The prefill upstream closed the connection.',
  too_large: 'The prefill upstream answered more than a prefill answer can be.',
  status: 'The prefill upstream answered with an error.',
  no_params: 'The prefill upstream answered without kv_transfer_params: it kept no KV cache for a remote decode.',
  no_engine: "The prefill rank's Mooncake bootstrap server did not name its engine.",
};
