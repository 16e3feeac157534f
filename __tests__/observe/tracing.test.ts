import { describe, expect, it, beforeAll, afterAll } from '@jest/globals';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { createTracing, NO_TRACING } from '../../lib/observe/tracing';
import { startGateway, type TestGateway } from '../helpers/app';
import { startEchoUpstream, type EchoUpstream } from '../helpers/echo-upstream';
import type { ExportedSpan, SeenByUpstream } from '../helpers/traced-gateway';

const ROOT = join(__dirname, '..', '..');
const TSX = join(ROOT, 'node_modules', '.bin', 'tsx');
const SERVER = 1;
const CLIENT = 2;
const ERROR = 2;

interface TracedRun {
  spans: ExportedSpan[];
  seen: SeenByUpstream[];
  answers: Record<string, number>;
}

describe('OpenTelemetry with the real SDK and the HTTP and Express instrumentations', () => {
  let run: TracedRun;
  beforeAll(async () => {
    const { stdout } = await promisify(execFile)(TSX, [join(__dirname, '..', 'helpers', 'traced-gateway.ts')], { cwd: ROOT, timeout: 60_000 });
    run = JSON.parse(stdout) as TracedRun;
  }, 90_000);

  /** The gateway's server span of the request tagged `case=name`: the one holding the decision. */
  const gatewaySpan = (name: string): ExportedSpan => {
    const client = run.spans.find((span) => span.kind === CLIENT && String(span.attributes['url.full']).endsWith(`case=${name}`))!;
    return run.spans.find((span) => span.kind === SERVER && span.traceId === client.traceId && span.attributes['dp_router.upstream'] !== undefined)!;
  };
  const traceIdSeenFor = (name: string) => run.seen.find((request) => request.url.endsWith(`case=${name}`))?.traceparents[0]?.split('-')[1];

  it('records the decision on the server span and the upstream joins its trace, with one traceparent', () => {
    expect(run.answers.assigned).toBe(200);
    const seen = run.seen.find((request) => request.url.endsWith('case=assigned'))!;
    expect(seen.traceparents).toHaveLength(1);
    expect(seen.traceparents[0]).toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
    const span = gatewaySpan('assigned');
    expect(span).toBeDefined();
    expect(span.traceId).toBe(traceIdSeenFor('assigned'));
    expect(span.attributes).toMatchObject({
      'dp_router.upstream': 'echo',
      'dp_router.source': 'assigned',
      'dp_router.policy': 'least-outstanding',
    });
    expect(typeof span.attributes['dp_router.rank']).toBe('number');
    expect(span.attributes['dp_router.hint_outcome']).toBeUndefined();
    // The upstream's parent is a span of the gateway's own trace (its outgoing client span).
    const parent = seen.traceparents[0].split('-')[2];
    expect(run.spans.find((candidate) => candidate.spanId === parent)?.traceId).toBe(span.traceId);
  });

  it('puts the decision on the HTTP server span, not on the Express spans current inside it', () => {
    const expressSpans = run.spans.filter((span) => span.name === 'request handler' || span.name.startsWith('middleware'));
    expect(expressSpans.length).toBeGreaterThan(0);
    expect(expressSpans.filter((span) => Object.keys(span.attributes).some((key) => key.startsWith('dp_router.')) || span.events.length > 0)).toEqual([]);
  });

  it('records which index scored a prefix-aware pick and the share of the prompt it matched', () => {
    expect(run.answers['prefix-seen']).toBe(200);
    expect(gatewaySpan('prefix-new').attributes).toMatchObject({ 'dp_router.policy': 'prefix-aware', 'dp_router.index': 'approximate', 'dp_router.prefix_matched_share': 0 });
    const seen = gatewaySpan('prefix-seen').attributes;
    expect(seen).toMatchObject({ 'dp_router.index': 'approximate', 'dp_router.prefix_matched_share': 1 });
    expect(seen['dp_router.rank']).toBe(gatewaySpan('prefix-new').attributes['dp_router.rank']);
    // Only prefix-aware scores a prefix.
    expect(gatewaySpan('assigned').attributes['dp_router.index']).toBeUndefined();
  });

  it('records on the span the share its own pick found, though another request was picked before its token reservation was answered', () => {
    expect(run.answers).toMatchObject({ 'reserved-warm': 200, 'reserved-first': 200, 'reserved-second': 200 });
    // The first repeats the warm request's prompt, all of it on the only endpoint; the second's, picked before the first was seated, is new.
    expect(gatewaySpan('reserved-first').attributes).toMatchObject({ 'dp_router.index': 'approximate', 'dp_router.prefix_matched_share': 1, 'dp_router.cached_tokens.predicted': 100 });
    expect(gatewaySpan('reserved-second').attributes).toMatchObject({ 'dp_router.index': 'approximate', 'dp_router.prefix_matched_share': 0, 'dp_router.cached_tokens.predicted': 0 });
  });

  it("records the decision of a request that waited in the admission queue on its own span, not the releasing request's", () => {
    expect(run.answers).toMatchObject({ 'queued-hold': 200, 'queued-first': 200, 'queued-second': 200 });
    for (const name of ['queued-first', 'queued-second']) {
      const span = gatewaySpan(name);
      expect(span).toBeDefined();
      expect(span.attributes).toMatchObject({ 'dp_router.upstream': 'echo', 'dp_router.policy': 'prefix-aware', 'dp_router.priority': 'normal' });
      expect(span.attributes['dp_router.queue_wait_ms']).toBeGreaterThan(0);
    }
    // The releasing request's span keeps its own decision (it did not wait).
    expect(gatewaySpan('queued-hold').attributes['dp_router.queue_wait_ms']).toBe(0);
  });

  it("records the route receipt of a prefix-aware pick on the span when the answer ends: cached tokens predicted and reported", () => {
    // Approximate picks predict a share of the prompt: none for the new one, all of it (100 tokens) for the one seen.
    expect(gatewaySpan('prefix-new').attributes).toMatchObject({ 'dp_router.cached_tokens.predicted': 0, 'dp_router.cached_tokens.reported': 96 });
    expect(gatewaySpan('prefix-seen').attributes).toMatchObject({ 'dp_router.cached_tokens.predicted': 100, 'dp_router.cached_tokens.reported': 96 });
    expect(gatewaySpan('assigned').attributes['dp_router.cached_tokens.reported']).toBeUndefined();
  });

  it("replaces a client's tracestate with the gateway's context when tracing (item 22.16)", () => {
    const seen = (name: string) => run.seen.find((request) => request.url.endsWith(`case=${name}`))!;
    // Continued trace: the caller's trace state travels in the gateway's own context, once.
    expect(seen('hinted').tracestates).toEqual(['vendor=caller']);
    // No trace to continue: the stray state is not forwarded beside the gateway's traceparent.
    expect(seen('state-only').traceparents).toHaveLength(1);
    expect(seen('state-only').tracestates).toEqual([]);
  });

  it('continues a caller’s trace and records the hint outcome', () => {
    const span = gatewaySpan('hinted');
    expect(span.traceId).toBe('0af7651916cd43dd8448eb211c80319c');
    expect(span.parentSpanId).toBe('b7ad6b7169203331');
    expect(span.attributes).toMatchObject({ 'dp_router.rank': 1, 'dp_router.source': 'hint', 'dp_router.hint_outcome': 'accepted' });
    const seen = run.seen.find((request) => request.url.endsWith('case=hinted'))!;
    expect(seen.traceparents).toHaveLength(1);
    // Not the caller's header forwarded as it came: the parent is the gateway's span.
    expect(seen.traceparents[0]).not.toBe('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
    expect(seen.traceparents[0].split('-')[1]).toBe(span.traceId);
  });

  it('records an ejection and a retry as events, and the endpoint that answered as the decision', () => {
    expect(run.answers.retried).toBe(200);
    const span = gatewaySpan('retried');
    expect(span.attributes).toMatchObject({ 'dp_router.upstream': 'echo', 'dp_router.policy': 'round-robin' });
    expect(span.events.map((event) => event.name)).toEqual(['dp_router.ejection', 'dp_router.retry']);
    expect(span.events[0].attributes).toEqual({ 'dp_router.upstream': 'refused', 'dp_router.rank': 0 });
    expect(span.events[1].attributes).toMatchObject({ 'dp_router.failed_upstream': 'refused', 'dp_router.upstream': 'echo' });
  });

  it('sets the span status on the gateway’s own error and keeps its reason', () => {
    expect(run.answers.failing).toBe(502);
    const span = gatewaySpan('failing');
    expect(span.status.code).toBe(ERROR);
    const event = span.events.find((candidate) => candidate.name === 'dp_router.error')!;
    expect(event.attributes).toEqual({ 'http.response.status_code': 502, 'dp_router.message': 'The upstream for data-parallel rank 0 refused the connection.' });
  });
});

describe('without tracing', () => {
  let upstream: EchoUpstream;
  let gateway: TestGateway;
  beforeAll(async () => {
    upstream = await startEchoUpstream();
    gateway = await startGateway({ upstreams: [{ url: upstream.url }] });
  });
  afterAll(async () => {
    await gateway.close();
    await upstream.close();
  });

  it('is a no-op when @opentelemetry/api cannot be loaded', () => {
    const missing = () => {
      throw Object.assign(new Error("Cannot find module '@opentelemetry/api'"), { code: 'MODULE_NOT_FOUND' });
    };
    expect(createTracing('round-robin', missing)).toBe(NO_TRACING);
    expect(createTracing('round-robin', () => ({}))).toBe(NO_TRACING);
  });

  it("puts a request's KV receipt on the span its decision went on, when the answer ends", () => {
    const attributes: Record<string, unknown> = {};
    const span = { isRecording: () => true, setAttribute: (key: string, value: unknown) => (attributes[key] = value), addEvent: () => undefined, setStatus: () => undefined };
    const api = { trace: { getActiveSpan: () => span }, context: { active: () => ({ getValue: () => undefined }) }, propagation: { inject: () => undefined }, SpanStatusCode: { ERROR: 2 } };
    const tracing = createTracing('prefix-aware', () => api);
    const req = {} as never;
    tracing.decided(req, { key: 'mock#1', upstream: 'mock', rank: 1, inflight: 0, load: 0, healthy: true }, 'assigned', undefined, {});
    tracing.receipted(req, 'confirmed', 32, 48);
    expect(attributes).toMatchObject({ 'dp_router.receipt': 'confirmed', 'dp_router.cached_tokens.predicted': 32, 'dp_router.cached_tokens.reported': 48 });
  });

  it('changes nothing on the proxied request when no span is recording (API installed, no SDK)', async () => {
    const callers = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    await fetch(`${gateway.url}/v1/models`, { headers: { traceparent: callers } });
    await fetch(`${gateway.url}/v1/models`);
    expect(upstream.seen[0].headers.traceparent).toBe(callers);
    expect(upstream.seen[1].headers.traceparent).toBeUndefined();
  });

  it("drops a client's baggage, and passes traceparent and tracestate on together when not tracing (item 22.16)", async () => {
    const callers = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const before = upstream.seen.length;
    await fetch(`${gateway.url}/v1/models`, { headers: { traceparent: callers, tracestate: 'vendor=x', baggage: `role=admin,${'k=v,'.repeat(800)}` } });
    const seen = upstream.seen[before].headers;
    expect(seen.baggage).toBeUndefined();
    expect(seen.traceparent).toBe(callers);
    expect(seen.tracestate).toBe('vendor=x');
  });
});
