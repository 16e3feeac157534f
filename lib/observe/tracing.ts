import type { IncomingMessage, ServerResponse } from 'node:http';
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
interface OpenTelemetryApi {
  trace: { getActiveSpan(): Span | undefined };
  context: { active(): unknown };
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
  decided(req: IncomingMessage, endpoint: Endpoint, source: DecisionSource, hintOutcome: HintOutcome | undefined): void;
  /**
   * `prefix-aware` scored the chosen endpoint on `index`, estimating that it holds `matchedShare`
   * of the prompt's blocks; recorded on the span the decision went on.
   */
  prefixScored(req: IncomingMessage, index: 'exact' | 'approximate', matchedShare: number): void;
  /** The request is sent again, to `next`, after `failed` failed it. */
  retried(req: IncomingMessage, failed: Endpoint, next: Endpoint): void;
  /** `endpoint` left rotation (on the span active when the failure that ejected it was seen). */
  ejected(endpoint: Endpoint): void;
  /** The gateway answered with its own error. */
  answeredError(res: ServerResponse, status: number, message: string): void;
}

export const NO_TRACING: Tracing = {
  enabled: false,
  decided: () => undefined,
  prefixScored: () => undefined,
  retried: () => undefined,
  ejected: () => undefined,
  answeredError: () => undefined,
};

/**
 * The span each traced request's decision went on. The active span is what the user's
 * instrumentation made current when the router ran; later events of the same request (a
 * retry, an error answered from a proxy callback) may run where another span is current.
 */
const spans = new WeakMap<IncomingMessage, Span>();

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
  const { trace, context, propagation } = api;

  return {
    enabled: true,
    decided(req, endpoint, source, hintOutcome) {
      const span = trace.getActiveSpan();
      if (span === undefined || !span.isRecording()) return;
      spans.set(req, span);
      span.setAttribute('dp_router.upstream', endpoint.upstream);
      span.setAttribute('dp_router.rank', endpoint.rank);
      span.setAttribute('dp_router.source', source);
      span.setAttribute('dp_router.policy', policy);
      if (hintOutcome !== undefined) span.setAttribute('dp_router.hint_outcome', hintOutcome);
      // http-proxy copies req.headers into the upstream request. A client's own trace headers
      // are replaced: the upstream's spans belong under the gateway's. (Where the HTTP
      // instrumentation also wraps the outgoing request, it injects its client span's
      // context over these, which is the same trace.)
      const headers = req.headers as Record<string, unknown>;
      if (headers.traceparent !== undefined) delete headers.traceparent;
      if (headers.tracestate !== undefined) delete headers.tracestate;
      propagation.inject(context.active(), headers);
    },
    prefixScored(req, index, matchedShare) {
      const span = spans.get(req);
      if (span === undefined) return;
      span.setAttribute('dp_router.index', index);
      span.setAttribute('dp_router.prefix_matched_share', matchedShare);
    },
    retried(req, failed, next) {
      const span = spans.get(req);
      if (span === undefined) return;
      span.setAttribute('dp_router.upstream', next.upstream);
      span.setAttribute('dp_router.rank', next.rank);
      span.addEvent('dp_router.retry', {
        'dp_router.failed_upstream': failed.upstream,
        'dp_router.failed_rank': failed.rank,
        'dp_router.upstream': next.upstream,
        'dp_router.rank': next.rank,
      });
    },
    ejected(endpoint) {
      const span = trace.getActiveSpan();
      if (span === undefined || !span.isRecording()) return;
      span.addEvent('dp_router.ejection', { 'dp_router.upstream': endpoint.upstream, 'dp_router.rank': endpoint.rank });
    },
    answeredError: markError,
  };
}

/** Called by `sendError`: the span of the request answered gets the gateway's error as its status. */
export function markError(res: ServerResponse, status: number, message: string): void {
  // A 4xx is the client's problem: OpenTelemetry's HTTP conventions leave a server span's status unset.
  if (loaded === undefined || status < 500) return;
  const span = (res.req !== undefined ? spans.get(res.req) : undefined) ?? loaded.trace.getActiveSpan();
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
