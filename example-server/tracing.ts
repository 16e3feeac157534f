import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { ExpressInstrumentation } from '@opentelemetry/instrumentation-express';
import { HttpInstrumentation } from '@opentelemetry/instrumentation-http';
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
  provider.register();
  // An instrumentation enables itself when made, on the provider just registered. Probes and
  // scrapes would drown the requests worth seeing.
  new HttpInstrumentation({ ignoreIncomingRequestHook: (req) => QUIET_PATHS.has(req.url ?? '') });
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
