import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { DecisionSource, Endpoint, HintOutcome } from '../types';

/**
 * The part of `@opentelemetry/api` the router uses, typed here so that the package compiles
 * and installs without it (it is an optional peer dependency).
 */
interface Span {
  isRecording(): boolean;
  setAttribute(key: string, value: string | number): unknown;
  addEvent(name: string, attributes?: Record<string, string | number>): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
}
interface Context {
  getValue(key: symbol): unknown;
}
interface OpenTelemetryApi {
  trace: { getActiveSpan(): Span | undefined };
  context: { active(): Context; bind<T>(context: Context, target: T): T };
  propagation: { inject(context: unknown, carrier: Record<string, unknown>, setter?: unknown): void };
  SpanStatusCode: { ERROR: number };
}

/** The router's reports to OpenTelemetry; a no-op stands in when the API is not installed. */
export interface Tracing {
  /** Whether the API was found (the no-op otherwise). */
  readonly enabled: boolean;
  /**
   * The request has its endpoint: the decision goes on the active span, and that span's
   * context onto the proxied request's headers (`traceparent`, `tracestate`).
   */
  decided(req: IncomingMessage, endpoint: Endpoint, source: DecisionSource, hintOutcome: HintOutcome | undefined, headers: IncomingHttpHeaders): void;
  /**
   * `prefix-aware` scored the chosen endpoint on `index`, estimating that it holds `matchedShare`
   * of the prompt's blocks; recorded on the span the decision went on.
   */
  prefixScored(req: IncomingMessage, index: 'exact' | 'approximate', matchedShare: number): void;
  /**
   * `step` run later (after an admission wait, from another request's release) in the context
   * active now: the request's own span, not the releasing one's, takes its decision and goes
   * to the upstream in `traceparent`.
   */
  keep<F extends (...args: never[]) => void>(step: F): F;
  /** Admission let the request through in class `priority` after `waitedMs` in the queue (0: it did not wait). */
  admitted(req: IncomingMessage, priority: string, waitedMs: number): void;
  /** The request is sent again, to `next`, after `failed` failed it. */
  retried(req: IncomingMessage, failed: Endpoint, next: Endpoint): void;
  /** `endpoint` left rotation (on the span active when the failure that ejected it was seen). */
  ejected(endpoint: Endpoint): void;
  /** The gateway answered with its own error. */
  answeredError(res: ServerResponse, status: number, message: string): void;
  /** One leg of a disaggregated request was sent to `endpoint` (an event on the request's span). */
  legSent(req: IncomingMessage, leg: 'prefill' | 'decode', endpoint: Endpoint): void;
  /**
   * The request's route receipts, when its answer ended: the KV receipt's outcome (`pending`
   * while its blocks are awaited), and the cached prompt tokens predicted and reported.
   */
  receipted(req: IncomingMessage, outcome: string | undefined, predicted: number | undefined, reported: number | undefined): void;
}

export const NO_TRACING: Tracing = {
  enabled: false,
  decided: () => undefined,
  prefixScored: () => undefined,
  keep: (step) => step,
  admitted: () => undefined,
  retried: () => undefined,
  ejected: () => undefined,
  answeredError: () => undefined,
  legSent: () => undefined,
  receipted: () => undefined,
};

/**
 * The span each traced request's decision went on. The active span is what the user's
 * instrumentation made current when the router ran; later events of the same request (a
 * retry, an error answered from a proxy callback) may run where another span is current.
 */
const spans = new WeakMap<IncomingMessage, Span>();

/**
 * Where the HTTP instrumentation keeps the incoming request's server span (`@opentelemetry/core`'s
 * RPC metadata; its key is `createContextKey(…)`, which is `Symbol.for(…)`). Express's
 * instrumentation makes a span per middleware and handler current, so the active span is one
 * of those; the decision belongs on the server span, where dashboards and docs look for it.
 */
const RPC_METADATA = Symbol.for('OpenTelemetry SDK Context Key RPC_METADATA');

/** The request's server span when the HTTP instrumentation recorded one, else the active span. */
function serverSpan(api: OpenTelemetryApi): Span | undefined {
  const metadata = api.context.active().getValue(RPC_METADATA) as { span?: Span } | undefined;
  return metadata?.span ?? api.trace.getActiveSpan();
}

/** The gateway's own error answers have no router at hand: the API found last is used. */
let loaded: OpenTelemetryApi | undefined;

/**
 * Reads `@opentelemetry/api` once, when a router is created. Without it, or without a
 * recording span (no SDK registered, or the request not sampled), every report costs one check.
 */
export function createTracing(policy: string, load: () => unknown = requireApi): Tracing {
  let api: OpenTelemetryApi | undefined;
  try {
    api = load() as OpenTelemetryApi | undefined;
  } catch {
    api = undefined;
  }
  if (api === undefined || typeof api.trace?.getActiveSpan !== 'function') return NO_TRACING;
  loaded = api;
  const { context, propagation } = api;

  return {
    enabled: true,
    decided(req, endpoint, source, hintOutcome, incoming) {
      // A client's `baggage` (free-form key=value pairs, e.g. `role=admin`) is dropped: there is
      // no rule by which to trust it. `traceparent` and `tracestate` go together: passed on
      // unchanged when this gateway is not tracing (W3C Trace Context's rule for a
      // non-participant), both replaced by the gateway's when it is.
      const headers = incoming as Record<string, unknown>;
      // `delete` takes V8's slow path even for a name that is not there.
      if (headers.baggage !== undefined) delete headers.baggage;
      const span = serverSpan(api);
      if (span === undefined || !span.isRecording()) return;
      delete headers.traceparent;
      delete headers.tracestate;
      spans.set(req, span);
      span.setAttribute('dp_router.upstream', endpoint.upstream);
      setRank(span, endpoint);
      span.setAttribute('dp_router.source', source);
      span.setAttribute('dp_router.policy', policy);
      if (hintOutcome !== undefined) span.setAttribute('dp_router.hint_outcome', hintOutcome);
      propagation.inject(context.active(), headers);
      delete headers.baggage;
      // http-proxy copies req.headers into the upstream request. A client's own trace headers
      // are replaced: the upstream's spans belong under the gateway's. (Where the HTTP
      // instrumentation also wraps the outgoing request, it injects its client span's
      // context over these, which is the same trace.)
    },
    prefixScored(req, index, matchedShare) {
      // The lifecycle reports the score before the decision: the server span, found either way.
      const span = spans.get(req) ?? serverSpan(api);
      if (span === undefined || !span.isRecording()) return;
      span.setAttribute('dp_router.index', index);
      span.setAttribute('dp_router.prefix_matched_share', matchedShare);
    },
    keep: (step) => context.bind(context.active(), step),
    admitted(req, priority, waitedMs) {
      const span = spans.get(req);
      if (span === undefined) return;
      span.setAttribute('dp_router.priority', priority);
      span.setAttribute('dp_router.queue_wait_ms', waitedMs);
    },
    retried(req, failed, next) {
      const span = spans.get(req);
      if (span === undefined) return;
      span.setAttribute('dp_router.upstream', next.upstream);
      setRank(span, next);
      span.addEvent('dp_router.retry', {
        'dp_router.failed_upstream': failed.upstream,
        ...(failed.rank >= 0 && { 'dp_router.failed_rank': failed.rank }),
        'dp_router.upstream': next.upstream,
        ...(next.rank >= 0 && { 'dp_router.rank': next.rank }),
      });
    },
    ejected(endpoint) {
      const span = serverSpan(api);
      if (span === undefined || !span.isRecording()) return;
      span.addEvent('dp_router.ejection', { 'dp_router.upstream': endpoint.upstream, 'dp_router.rank': endpoint.rank });
    },
    answeredError: markError,
    legSent(req, leg, endpoint) {
      const span = spans.get(req);
      if (span === undefined) return;
      span.addEvent(`dp_router.${leg}`, { 'dp_router.upstream': endpoint.upstream, 'dp_router.rank': endpoint.rank });
    },
    receipted(req, outcome, predicted, reported) {
      // The answer ended, and the server span with it only once the response does.
      const span = spans.get(req);
      if (span === undefined || !span.isRecording()) return;
      if (outcome !== undefined) span.setAttribute('dp_router.receipt', outcome);
      if (predicted !== undefined) span.setAttribute('dp_router.cached_tokens.predicted', predicted);
      if (reported !== undefined) span.setAttribute('dp_router.cached_tokens.reported', reported);
    },
  };
}

/** Called by `sendError`: the span of the request answered gets the gateway's error as its status. */
export function markError(res: ServerResponse, status: number, message: string): void {
  // A 4xx is the client's problem: OpenTelemetry's HTTP conventions leave a server span's status unset.
  if (loaded === undefined || status < 500) return;
  const span = (res.req !== undefined ? spans.get(res.req) : undefined) ?? serverSpan(loaded);
  if (span === undefined || !span.isRecording()) return;
  span.setStatus({ code: loaded.SpanStatusCode.ERROR, message });
  // The HTTP instrumentation sets the status again when the response ends, without a message:
  // the event keeps the gateway's reason.
  span.addEvent('dp_router.error', { 'http.response.status_code': status, 'dp_router.message': message });
}

function requireApi(): unknown {
  // A plain require: the package ships CommonJS (the ESM entry re-exports it), and a bundler
  // sees a static string it can leave external.
  return require('@opentelemetry/api');
}

/**
 * `dp_router.rank`, or, where vLLM picks the engine (a path it balances itself, or an upstream
 * whose rank header it does not honour: the endpoint's rank is negative), `dp_router.engine_chosen_by: 'vllm'`.
 */
function setRank(span: { setAttribute(name: string, value: string | number): unknown }, endpoint: Endpoint): void {
  if (endpoint.rank >= 0) span.setAttribute('dp_router.rank', endpoint.rank);
  else span.setAttribute('dp_router.engine_chosen_by', 'vllm');
}
