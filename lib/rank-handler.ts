import type { IncomingMessage, ServerResponse } from 'node:http';
import { hasBody, isJson, readBody } from './body';
import type { EndpointTable, RouteEndpoint } from './endpoints';
import { sendError } from './errors';
import { countHeaderLines, parseBodyRankHint, parseRankHint, type RankHintResult } from './hint';
import type { HintOutcome, RouterMetrics } from './metrics';
import type { Configuration } from './options';
import { extractPrompt } from './prompt';
import { RankDecision, RouteState, type RoutedRequest } from './route-state';
import type { DecisionSource, PickContext } from './types';

/** Express's `next`: called with an error for the code's own problems. */
export type Next = (error?: unknown) => void;
/** What follows a decision: `req.dpRank` and the rank header are set, `route` holds the endpoint. */
export type Proceed = (req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState) => void;

type JudgedHint = { outcome: HintOutcome; rank?: number; param: string };
type HintVerdict = { outcome: 'none' } | JudgedHint;

const NO_HINT: HintVerdict = { outcome: 'none' };

/**
 * The per-request core shared by `dpRank()` and `dpRouter()`: strips client copies of the
 * rank header, judges any hint, assigns a rank, and holds the in-flight slot until the
 * response closes. Client mistakes are answered here; only the code's own faults reach `next(error)`.
 */
export function createRankHandler(config: Configuration, table: EndpointTable, metrics: RouterMetrics, proceed: Proceed) {
  const { hintHeader, header, hintBodyField, policy, trust, onInvalid } = config;
  const readsAffinityBody = policy.usesAffinityKey === true && config.affinityBodyField !== undefined;
  let warnedParsedBody = false;

  function handle(req: RoutedRequest, res: ServerResponse, next: Next): void {
    const route = new RouteState();
    let trusted: boolean;
    try {
      trusted = trust === true || (trust !== false && trust(req) === true);
    } catch (error) {
      next(error);
      return;
    }
    const { headers } = req;
    const headerHint = headers[hintHeader] !== undefined ? judgeHeader(req, trusted) : NO_HINT;
    // `delete` always takes V8's slow path, so only where there is something to remove.
    if (headerHint !== NO_HINT) delete headers[hintHeader];
    if (headers[header] !== undefined) delete headers[header];
    // Node answered `100 Continue` itself before this handler ran; forwarding the expectation
    // would only make http-proxy skip its `proxyReq` event, where timeouts are armed.
    if (headers.expect !== undefined) delete headers.expect;

    const wantsBody =
      policy.usesPrompt === true ||
      (readsAffinityBody && headerKey(req) === undefined) ||
      (trusted && hintBodyField !== undefined && headerHint === NO_HINT);
    if (req.readableEnded && hasBody(req)) {
      // A body parser ran first: the stream is spent, so its result is all there is to read
      // and to forward.
      if (replayParsedBody(req, route) && !warnedParsedBody) {
        warnedParsedBody = true;
        config.logger.warn(PARSED_BODY_NOTICE);
      }
      decide(req, res, next, route, trusted, headerHint, wantsBody ? req.body : undefined);
      return;
    }
    if (!wantsBody || !hasBody(req) || !isJson(req)) {
      decide(req, res, next, route, trusted, headerHint, undefined);
      return;
    }
    readBody(req, config.maxBodyBytes).then((result) => {
      if (!result.ok) {
        if (result.failure === 'too_large') {
          res.setHeader('connection', 'close');
          sendError(res, 413, 'RequestEntityTooLargeError', `Request body exceeds ${config.maxBodyBytes} bytes.`);
        }
        return;
      }
      let body: unknown;
      try {
        body = JSON.parse(result.bytes.toString('utf8'));
      } catch {
        sendError(res, 400, 'BadRequestError', 'Request body is not valid JSON.');
        return;
      }
      route.body = result.bytes;
      route.parsedBody = body;
      decide(req, res, next, route, trusted, headerHint, body);
    }, next);
  }

  function judgeHeader(req: IncomingMessage, trusted: boolean): HintVerdict {
    if (!trusted) return { outcome: 'untrusted', param: hintHeader };
    if (countHeaderLines(req.rawHeaders, hintHeader) !== 1) return { outcome: 'malformed', param: hintHeader };
    return judgeRank(parseRankHint(req.headers[hintHeader]), hintHeader);
  }

  function judgeBodyField(body: unknown, trusted: boolean): HintVerdict {
    if (hintBodyField === undefined || typeof body !== 'object' || body === null || !Object.hasOwn(body, hintBodyField)) {
      return NO_HINT;
    }
    if (!trusted) return { outcome: 'untrusted', param: hintBodyField };
    return judgeRank(parseBodyRankHint((body as Record<string, unknown>)[hintBodyField]), hintBodyField);
  }

  function judgeRank(parsed: RankHintResult, param: string): HintVerdict {
    if (!parsed.ok) return { outcome: 'malformed', param };
    if (!table.isRoutable(parsed.rank)) return { outcome: 'out_of_range', rank: parsed.rank, param };
    if (table.healthyOfRank(parsed.rank).length === 0) return { outcome: 'unavailable', rank: parsed.rank, param };
    return { outcome: 'accepted', rank: parsed.rank, param };
  }

  function decide(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, trusted: boolean, headerHint: HintVerdict, body: unknown): void {
    if (res.destroyed) return;
    const verdict = headerHint === NO_HINT ? judgeBodyField(body, trusted) : headerHint;
    if (verdict.outcome !== 'none') metrics.hint(verdict.outcome);
    if (verdict.outcome === 'accepted') {
      dispatch(req, res, next, route, leastLoaded(table.healthyOfRank(verdict.rank!)), 'hint', 'accepted');
      return;
    }
    if (onInvalid === 'reject' && verdict.outcome !== 'none' && verdict.outcome !== 'untrusted') {
      reject(res, verdict);
      return;
    }
    const candidates = table.healthy();
    if (candidates.length === 0) {
      sendError(res, 503, 'ServiceUnavailableError', 'No healthy data-parallel endpoint is available.');
      return;
    }
    const context: PickContext = {
      path: req.originalUrl ?? req.url ?? '/',
      affinityKey: policy.usesAffinityKey ? affinityKeyOf(req, body) : undefined,
      prompt: policy.usesPrompt && body !== undefined ? extractPrompt(body) : undefined,
    };
    route.context = context;
    let chosen: RouteEndpoint;
    try {
      chosen = policy.pick(candidates, context) as RouteEndpoint;
    } catch (error) {
      next(error);
      return;
    }
    if (!candidates.includes(chosen)) {
      next(new TypeError(`express-dp-router: policy '${policy.name}' returned an endpoint that was not among the candidates.`));
      return;
    }
    dispatch(req, res, next, route, chosen, 'assigned', verdict.outcome === 'none' ? undefined : verdict.outcome);
  }

  function reject(res: ServerResponse, verdict: JudgedHint): void {
    const name = verdict.param;
    if (verdict.outcome === 'malformed') {
      sendError(res, 400, 'BadRequestError', `${name} must be a single non-negative decimal rank without sign, spaces or leading zeros.`, name);
    } else if (verdict.outcome === 'out_of_range') {
      sendError(res, 400, 'BadRequestError', `${name} ${verdict.rank} is not a routable data-parallel rank (routable: ${table.routableRanks}).`, name);
    } else {
      sendError(res, 503, 'ServiceUnavailableError', `Data-parallel rank ${verdict.rank} has no healthy endpoint.`, name);
    }
  }

  /** The session key from the affinity header, when it carries one. */
  function headerKey(req: IncomingMessage): string | undefined {
    if (config.affinityHeader === undefined) return undefined;
    const value = req.headers[config.affinityHeader];
    if (typeof value === 'string' && value.length > 0) return value;
    if (Array.isArray(value) && value.length > 0) return value[0];
    return undefined;
  }

  function affinityKeyOf(req: IncomingMessage, body: unknown): string | undefined {
    const fromHeader = headerKey(req);
    if (fromHeader !== undefined) return fromHeader;
    if (config.affinityBodyField !== undefined && typeof body === 'object' && body !== null) {
      const value = (body as Record<string, unknown>)[config.affinityBodyField];
      if ((typeof value === 'string' && value.length > 0) || typeof value === 'number') return String(value);
    }
    return undefined;
  }

  function dispatch(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, endpoint: RouteEndpoint, source: DecisionSource, hintOutcome: HintOutcome | undefined): void {
    endpoint.inflight++;
    metrics.dispatched(endpoint, source);
    if (endpoint.headerValue !== undefined) req.headers[header] = endpoint.headerValue;
    route.endpoint = endpoint;
    req.dpRank = new RankDecision(endpoint, source, route);
    if (config.exposeDecision) res.setHeader('x-dp-router-decision', endpoint.receipts[source]);
    route.started = performance.now();
    // One listener per request does all the work its end needs. It holds the state itself:
    // what a later middleware does to `req.dpRank` cannot make a slot leak.
    res.on('close', () => {
      route.responseClosed(res);
      // A retry may have moved the slot to another endpoint: release the one held now.
      const held = route.endpoint!;
      held.inflight--;
      metrics.finished(held, (performance.now() - route.started) / 1000);
    });
    // Before proceeding: the trace context goes onto the headers the proxy copies.
    config.tracing.decided(req, endpoint, source, hintOutcome);
    config.logger.decided(endpoint, source, policy.name, hintOutcome);
    proceed(req, res, next, route);
  }

  return handle;
}

/** Among replicas of one rank, the least loaded; the first on ties. */
function leastLoaded(replicas: readonly RouteEndpoint[]): RouteEndpoint {
  let best = replicas[0];
  for (let index = 1; index < replicas.length; index++) if (replicas[index].load < best.load) best = replicas[index];
  return best;
}

const PARSED_BODY_NOTICE =
  'express-dp-router: the request body was already parsed (e.g. by express.json()); it is re-encoded to forward it. Mount the router before body parsers to forward the original bytes.';

/** The stream was consumed before us: forward the parser's result, re-encoded. Returns whether it did. */
function replayParsedBody(req: RoutedRequest, route: RouteState): boolean {
  const bytes = encodeParsedBody(req.body);
  if (bytes === undefined) return false;
  req.headers['content-length'] = String(bytes.length);
  delete req.headers['transfer-encoding'];
  route.body = bytes;
  return true;
}

/** `express.raw()` leaves a Buffer, `express.text()` a string, `express.json()` a value. */
function encodeParsedBody(body: unknown): Buffer | undefined {
  if (body === undefined) return undefined;
  if (Buffer.isBuffer(body)) return body;
  if (typeof body === 'string') return Buffer.from(body);
  return Buffer.from(JSON.stringify(body));
}
