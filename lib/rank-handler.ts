import type { IncomingMessage, ServerResponse } from 'node:http';
import { hasBody, isJson, readBody } from './body';
import type { EndpointTable, RouteEndpoint } from './endpoints';
import { sendError } from './errors';
import { atHeaderLimit, countHeaderLines, parseBodyRankHint, parseRankHint, type RankHintResult } from './hint';
import { decodeField, fieldToken, scanFields, type JsonField } from './json-fields';
import type { HintOutcome, RouterMetrics } from './metrics';
import type { ExactLookup, IndexSource } from './kv-events/exact-pick';
import type { Configuration } from './options';
import type { PrefixPickContext } from './policies/prefix-aware';
import { extractPrompt } from './prompt';
import { SETTLED } from './proxy';
import { RankDecision, RouteState, type RoutedRequest } from './route-state';
import type { DecisionSource, PickContext } from './types';

/** Express's `next`: called with an error for the code's own problems. */
export type Next = (error?: unknown) => void;
/** What follows a decision: `req.dpRank` and the rank header are set, `route` holds the endpoint. */
export type Proceed = (req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState) => void;

type JudgedHint = { outcome: HintOutcome; rank?: number; param: string };
type HintVerdict = { outcome: 'none' } | JudgedHint;
/** The body's bytes and the spans of the members routing reads, by name index. */
type BodyView = { readonly bytes: Buffer; readonly fields: ReadonlyArray<JsonField[] | undefined> };

const NO_HINT: HintVerdict = { outcome: 'none' };
/** What decoding one JSON value may cost, beyond its text: measured 40 bytes (a 16 MiB body of `[],` held 213 MiB), with margin. */
const BYTES_PER_NODE = 48;
/** What decoding a whole body for the tokenizer may cost, per body byte: its text twice (UTF-16) and the values, with margin. */
const BODY_DECODE_FACTOR = 4;
/** Longest token a valid rank can be written with (10 digits). */
const MAX_RANK_TOKEN = 10;

/**
 * The per-request core shared by `dpRank()` and `dpRouter()`: strips client copies of the
 * rank header, judges any hint, assigns a rank, and holds the in-flight slot until the
 * response closes. Client mistakes are answered here; only the code's own faults reach `next(error)`.
 */
export function createRankHandler(config: Configuration, table: EndpointTable, metrics: RouterMetrics, proceed: Proceed, exact?: ExactLookup) {
  const { hintHeader, header, hintBodyField, policy, trust, onInvalid, bodyBudget, bodyTimeoutMs } = config;
  const readsAffinityBody = policy.usesAffinityKey === true && config.affinityBodyField !== undefined;
  // The members routing reads, scanned for once per body; the same name asked twice shares a slot.
  const names: string[] = [];
  const slot = (name: string | undefined) => (name === undefined ? -1 : names.includes(name) ? names.indexOf(name) : names.push(name) - 1);
  const HINT = slot(hintBodyField);
  const AFFINITY = slot(readsAffinityBody ? config.affinityBodyField : undefined);
  const PROMPT = slot(policy.usesPrompt ? 'prompt' : undefined);
  const MESSAGES = slot(policy.usesPrompt ? 'messages' : undefined);
  const encodedNames = names.map((name) => Buffer.from(name));
  let warnedParsedBody = false;
  // The decision header names the index that scored the rank (docs/exact-prefix-routing.md).
  const namesIndex = config.exposeDecision && policy.name === 'prefix-aware';

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
    const headerHint = headers[hintHeader] !== undefined || (trusted && headersCut(req)) ? judgeHeader(req, trusted) : NO_HINT;
    // `delete` always takes V8's slow path, so only where there is something to remove.
    if (headers[hintHeader] !== undefined) delete headers[hintHeader];
    if (headers[header] !== undefined) delete headers[header];
    // Node answered `100 Continue` itself before this handler ran; forwarding the expectation
    // would only make http-proxy skip its `proxyReq` event, where timeouts are armed.
    if (headers.expect !== undefined) delete headers.expect;

    // A body hint field is read whoever sent it: an untrusted one is counted and never forwarded.
    const wantsBody = policy.usesPrompt === true || (readsAffinityBody && headerKey(req) === undefined) || hintBodyField !== undefined;
    if (req.readableEnded && hasBody(req)) {
      // A body parser ran first: the stream is spent, so its result is all there is to read
      // and to forward.
      if (replayParsedBody(req, route) && !warnedParsedBody) {
        warnedParsedBody = true;
        config.logger.warn(PARSED_BODY_NOTICE);
      }
      decide(req, res, next, route, trusted, headerHint, wantsBody ? parsedBodyView(req, route) : undefined);
      return;
    }
    if (hasBody(req) && !req.complete) {
      route.bodyDeadline = setTimeout(bodyTimedOut, bodyTimeoutMs, req, res, route);
      req.once('close', () => clearTimeout(route.bodyDeadline));
    }
    if (!wantsBody || !hasBody(req) || !isJson(req)) {
      decide(req, res, next, route, trusted, headerHint, undefined);
      return;
    }
    const lease = route.leaseFrom(bodyBudget, res);
    if (lease === undefined) return;
    readBody(req, config.maxBodyBytes, lease).then((result) => {
      if (!result.ok) {
        if (result.failure === 'too_large') {
          res.setHeader('connection', 'close');
          sendError(res, 413, 'RequestEntityTooLargeError', `Request body exceeds ${config.maxBodyBytes} bytes.`);
        } else if (result.failure === 'over_budget') {
          overBudget(req, res, Number(req.headers['content-length']) || 0);
        }
        return;
      }
      const scan = scanFields(result.bytes, encodedNames);
      if (!scan.ok) {
        const message = scan.repeated ? 'Request body repeats a field the router reads.' : 'Request body is not valid JSON.';
        sendError(res, 400, 'BadRequestError', message);
        return;
      }
      route.body = result.bytes;
      decide(req, res, next, route, trusted, headerHint, { bytes: result.bytes, fields: scan.fields });
    }, next);
  }

  /** The router's budget cannot hold this body now: 503 to retry later, or 413 when it never could. */
  function overBudget(req: IncomingMessage, res: ServerResponse, bytes: number): void {
    // The rest of the body is discarded as it arrives (nothing is held; `timeouts.bodyMs` bounds
    // a trickle), so the connection stays usable and the client reads the answer, not a reset.
    req.resume();
    if (bytes > bodyBudget.limit) {
      sendError(res, 413, 'RequestEntityTooLargeError', `Request body exceeds the router's body budget of ${bodyBudget.limit} bytes.`);
    } else {
      res.setHeader('retry-after', '1');
      sendError(res, 503, 'ServiceUnavailableError', 'The router is holding as many request bodies as it may; retry shortly.');
    }
  }

  /** The body still arriving at `timeouts.bodyMs`: answer 408, close, and stop any upstream request without blaming it. */
  function bodyTimedOut(req: IncomingMessage, res: ServerResponse, route: RouteState): void {
    if (req.complete || res.writableEnded || res.destroyed) return;
    route.phase = SETTLED;
    route.clearDeadlines();
    route.upstreamRequest?.destroy();
    if (!res.headersSent) res.setHeader('connection', 'close');
    sendError(res, 408, 'RequestTimeoutError', `The request body did not arrive within ${bodyTimeoutMs} ms.`);
  }

  function judgeHeader(req: IncomingMessage, trusted: boolean): HintVerdict {
    if (!trusted) return { outcome: 'untrusted', param: hintHeader };
    if (headersCut(req) || countHeaderLines(req.rawHeaders, hintHeader) !== 1) return { outcome: 'malformed', param: hintHeader };
    return judgeRank(parseRankHint(req.headers[hintHeader]), hintHeader);
  }

  function judgeBodyField(view: BodyView | undefined, trusted: boolean): HintVerdict {
    const found = HINT === -1 || view === undefined ? undefined : view.fields[HINT];
    if (found === undefined) return NO_HINT;
    if (!trusted) return { outcome: 'untrusted', param: hintBodyField! };
    // Two copies may be read differently by two decoders, as two header lines may.
    if (found.length !== 1 || found[0].end - found[0].start > MAX_RANK_TOKEN) return { outcome: 'malformed', param: hintBodyField! };
    return judgeRank(parseBodyRankHint(fieldToken(view!.bytes, found[0])), hintBodyField!);
  }

  function judgeRank(parsed: RankHintResult, param: string): HintVerdict {
    if (!parsed.ok) return { outcome: 'malformed', param };
    if (!table.isRoutable(parsed.rank)) return { outcome: 'out_of_range', rank: parsed.rank, param };
    if (table.healthyOfRank(parsed.rank).length === 0) return { outcome: 'unavailable', rank: parsed.rank, param };
    return { outcome: 'accepted', rank: parsed.rank, param };
  }

  function decide(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, trusted: boolean, headerHint: HintVerdict, body: BodyView | undefined): void {
    if (res.destroyed) return;
    if (HINT !== -1) route.hintFields = body?.fields[HINT];
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
    const affinityKey = policy.usesAffinityKey ? affinityKeyOf(req, body, route) : undefined;
    const prompt = policy.usesPrompt && body !== undefined ? promptOf(body, route) : undefined;
    const context: PickContext = { path: req.originalUrl ?? req.url ?? '/', affinityKey, prompt };
    // A retry picks again among other candidates, without the exact view of these.
    route.context = context;
    const pickContext = exact !== undefined && prompt !== undefined ? withExact(context, body!, route, candidates) : context;
    let chosen: RouteEndpoint;
    try {
      chosen = policy.pick(candidates, pickContext) as RouteEndpoint;
    } catch (error) {
      next(error);
      return;
    }
    if (!candidates.includes(chosen)) {
      next(new TypeError(`express-dp-router: policy '${policy.name}' returned an endpoint that was not among the candidates.`));
      return;
    }
    const index = namesIndex ? ((pickContext as PrefixPickContext).exact?.source ?? 'approximate') : undefined;
    dispatch(req, res, next, route, chosen, 'assigned', verdict.outcome === 'none' ? undefined : verdict.outcome, index);
  }

  /**
   * The pick context with the exact index's view of the candidates, from the whole body
   * (a chat's template fields count), decoded within the body budget and dropped after.
   */
  function withExact(context: PickContext, body: BodyView, route: RouteState, candidates: readonly RouteEndpoint[]): PrefixPickContext {
    const cost = BODY_DECODE_FACTOR * body.bytes.length;
    const lease = route.lease;
    if (lease !== undefined && !lease.grow(cost)) return context;
    try {
      const found = exact!.lookupRequest(context.path, body.bytes, candidates);
      return found === undefined ? context : { ...context, exact: found };
    } finally {
      lease?.shrink(cost);
    }
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

  /** The session key; one from the body counts against the budget while kept, or is not used. */
  function affinityKeyOf(req: IncomingMessage, body: BodyView | undefined, route: RouteState): string | undefined {
    const fromHeader = headerKey(req);
    if (fromHeader !== undefined) return fromHeader;
    const found = AFFINITY === -1 || body === undefined ? undefined : body.fields[AFFINITY];
    if (found === undefined) return undefined;
    // Only a string or a number can be a key: anything else is not decoded at all.
    const field = found[found.length - 1];
    const first = body!.bytes[field.start];
    if (first !== 0x22 && first !== 0x2d && (first < 0x30 || first > 0x39)) return undefined;
    if (route.lease !== undefined && !route.lease.grow(2 * (field.end - field.start))) return undefined;
    const value = decodeField(body!.bytes, field);
    if ((typeof value === 'string' && value.length > 0) || typeof value === 'number') return String(value);
    return undefined;
  }

  /**
   * The prompt text from the `prompt` or `messages` member alone. Decoding is bounded by the
   * body budget: when what it may cost (or the text kept for a retry's pick, until the response
   * ends) does not fit, the request is routed as one without a prompt rather than refused, since
   * its body is already held within the budget. The decoded values are dropped once the text is made.
   */
  function promptOf(body: BodyView, route: RouteState): string | undefined {
    const prompt = body.fields[PROMPT];
    const messages = body.fields[MESSAGES];
    if (prompt === undefined && messages === undefined) return undefined;
    let cost = 0;
    for (const found of [prompt, messages]) {
      if (found === undefined) continue;
      const field = found[found.length - 1];
      cost += field.nodes * BYTES_PER_NODE + 2 * (field.end - field.start);
    }
    const lease = route.lease;
    if (lease !== undefined && !lease.grow(cost)) return undefined;
    let text: string | undefined;
    try {
      const members: Record<string, unknown> = {};
      if (prompt !== undefined) members.prompt = decodeField(body.bytes, prompt[prompt.length - 1]);
      if (messages !== undefined) members.messages = decodeField(body.bytes, messages[messages.length - 1]);
      text = extractPrompt(members);
    } finally {
      lease?.shrink(cost);
    }
    if (text !== undefined && lease !== undefined && !lease.grow(2 * text.length)) return undefined;
    return text;
  }

  /** The members routing reads from a body a parser already decoded, found in its re-encoding. */
  function parsedBodyView(req: RoutedRequest, route: RouteState): BodyView | undefined {
    const bytes = route.body;
    if (bytes === undefined || typeof req.body !== 'object' || req.body === null || Buffer.isBuffer(req.body)) return undefined;
    const scan = scanFields(bytes, encodedNames);
    return scan.ok ? { bytes, fields: scan.fields } : undefined;
  }

  /** Whether Node may have dropped header lines (`server.maxHeadersCount`): a hint line could be among them. */
  function headersCut(req: IncomingMessage): boolean {
    const server = (req.socket as { server?: { maxHeadersCount?: number | null } } | null)?.server;
    return atHeaderLimit(req.rawHeaders.length / 2, server?.maxHeadersCount);
  }

  function dispatch(
    req: RoutedRequest,
    res: ServerResponse,
    next: Next,
    route: RouteState,
    endpoint: RouteEndpoint,
    source: DecisionSource,
    hintOutcome: HintOutcome | undefined,
    index?: IndexSource,
  ): void {
    endpoint.inflight++;
    metrics.dispatched(endpoint, source);
    if (endpoint.headerValue !== undefined) req.headers[header] = endpoint.headerValue;
    route.endpoint = endpoint;
    route.carryRank(req, endpoint);
    req.dpRank = new RankDecision(endpoint, source, route);
    if (config.exposeDecision) res.setHeader('x-dp-router-decision', index === undefined ? endpoint.receipts[source] : `${endpoint.receipts[source]}; index=${index}`);
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
