import type { Context, TextMapGetter, TextMapPropagator, TextMapSetter } from '@opentelemetry/api';
import { TRACE_STATE_HEADER, W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { ExpressInstrumentation } from '@opentelemetry/instrumentation-express';
import { HttpInstrumentation } from '@opentelemetry/instrumentation-http';
import { IncomingMessage } from 'node:http';
import { defaultResource, detectResources, envDetector, resourceFromAttributes, type Resource } from '@opentelemetry/resources';
import { BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

/** Tracing as a Node gateway sets it up; `shutdown()` sends what is still buffered. */
export interface RunningTracing {
  shutdown(): Promise<void>;
}

/**
 * Exports traces over OTLP/HTTP to `endpoint` (a collector's or Jaeger's, e.g.
 * `http://127.0.0.1:4318`; `/v1/traces` is added to a URL without a path). Must run before
 * express and the router are loaded: the instrumentations patch modules as they are required.
 */
export function startTracing(endpoint: string): RunningTracing {
  const url = new URL(endpoint);
  if (url.pathname === '/') url.pathname = '/v1/traces';
  const provider = new NodeTracerProvider({ resource: gatewayResource(), spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: url.href }))] });
  provider.register({ propagator: new TraceparentOnly() });
  // An instrumentation enables itself when made, on the provider just registered. Probes and
  // scrapes would drown the requests worth seeing.
  new HttpInstrumentation({ ignoreIncomingRequestHook: (req) => QUIET_PATHS.has(req.url ?? ''), requestHook: dropClientTraceData });
  new ExpressInstrumentation();
  return { shutdown: () => provider.shutdown() };
}

/** The gateway's service name in every trace. */
export const SERVICE_NAME = 'express-dp-router-gateway';

/**
 * What the traces say produced them: `service.name` is {@link SERVICE_NAME}, unless
 * `OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`) names another, as every OpenTelemetry SDK reads them.
 */
export function gatewayResource(): Resource {
  return defaultResource()
    .merge(resourceFromAttributes({ 'service.name': SERVICE_NAME }))
    .merge(detectResources({ detectors: [envDetector] }));
}

const QUIET_PATHS = new Set(['/metrics', '/healthz', '/readyz']);

/**
 * W3C Trace Context as docs/security.md promises it: a client's `traceparent` is followed (the
 * gateway's spans, and vLLM's under them, join its trace) and replaced by the gateway's own on
 * the proxied request. Its `tracestate` (vendors' opaque data, here from an unknown caller) is not
 * read, so the proxied request carries only what the gateway's spans hold: none unless a sampler
 * of yours writes some. There is no W3C Baggage propagator: a client's `baggage` (say
 * `role=admin`) is neither read into the gateway's context nor sent on.
 */
class TraceparentOnly implements TextMapPropagator {
  private readonly w3c = new W3CTraceContextPropagator();

  inject(context: Context, carrier: unknown, setter: TextMapSetter): void {
    this.w3c.inject(context, carrier, setter);
  }

  extract(context: Context, carrier: unknown, getter: TextMapGetter): Context {
    return this.w3c.extract(context, carrier, {
      keys: (from) => getter.keys(from).filter((key) => key !== TRACE_STATE_HEADER),
      get: (from, key) => (key === TRACE_STATE_HEADER ? undefined : getter.get(from, key)),
    });
  }

  fields(): string[] {
    return this.w3c.fields();
  }
}

/**
 * The client's own `tracestate` and `baggage` lines leave the request as it arrives: the router
 * replaces the trace headers only on a request that is sampled, and the proxy copies the rest.
 */
function dropClientTraceData(_span: unknown, request: unknown): void {
  if (!(request instanceof IncomingMessage)) return;
  delete request.headers[TRACE_STATE_HEADER];
  delete request.headers.baggage;
}
