import { afterEach, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { gatewayResource, SERVICE_NAME } from '../../example-server/tracing';
import { closedAfterEach, serve, waitFor } from '../helpers';

const ROOT = join(__dirname, '..', '..');
const started = closedAfterEach();

describe("the example gateway's trace resource", () => {
  const saved = { OTEL_SERVICE_NAME: process.env.OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: process.env.OTEL_RESOURCE_ATTRIBUTES };
  afterEach(() => {
    for (const [key, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
  });

  it('names the service express-dp-router-gateway', () => {
    delete process.env.OTEL_SERVICE_NAME;
    delete process.env.OTEL_RESOURCE_ATTRIBUTES;
    expect(SERVICE_NAME).toBe('express-dp-router-gateway');
    expect(gatewayResource().attributes['service.name']).toBe('express-dp-router-gateway');
  });

  it('takes OTEL_SERVICE_NAME over it, as OpenTelemetry SDKs do', () => {
    process.env.OTEL_SERVICE_NAME = 'gateway-eu-1';
    expect(gatewayResource().attributes['service.name']).toBe('gateway-eu-1');
  });
});

describe('trace headers through the example gateway with --otlp-endpoint (item 41.14)', () => {
  /** Every raw line of the trace headers one request brought. */
  type TraceLines = Record<'traceparent' | 'tracestate' | 'baggage', string[]>;

  it("replaces the client's traceparent and tracestate and drops its baggage, sampled or not, as docs/security.md says", async () => {
    const seen: TraceLines[] = [];
    const upstream = await serve((req, res) => {
      const lines: TraceLines = { traceparent: [], tracestate: [], baggage: [] };
      for (let index = 0; index < req.rawHeaders.length; index += 2) {
        const name = req.rawHeaders[index].toLowerCase();
        if (name === 'traceparent' || name === 'tracestate' || name === 'baggage') lines[name].push(req.rawHeaders[index + 1]);
      }
      seen.push(lines);
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"object":"list","data":[]}'));
    });
    const collector = await serve((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
    });
    started.push(upstream, collector);
    const child = spawn(join(ROOT, 'node_modules', '.bin', 'tsx'), [join(ROOT, 'example-server', 'main.ts'), '--port', '0', '--upstream', upstream.url, '--dp-size', '1', '--otlp-endpoint', collector.url], { cwd: ROOT });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<void>((resolve) => child.on('close', () => resolve()));
    try {
      await checkThrough(() => output, seen);
    } finally {
      // Before the collector closes: the gateway sends its last spans as it stops.
      child.kill('SIGTERM');
      await exited;
    }
  });

  async function checkThrough(output: () => string, seen: TraceLines[]): Promise<void> {
    await waitFor(() => /listening on http:\/\/127\.0\.0\.1:\d+/.test(output()), 20_000, () => `no start-up line in ${output()}`);
    const gateway = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(output())![1];
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    const tracestate = 'vendor=client-chosen,other=opaque';
    // About 3.3 KB.
    const baggage = `role=admin,${Array.from({ length: 135 }, (_, i) => `k${i}=${'v'.repeat(20)}`).join(',')}`;
    for (const flags of ['01', '00']) {
      const answer = await fetch(`${gateway}/v1/models`, { headers: { traceparent: `00-${traceId}-00f067aa0ba902b7-${flags}`, tracestate, baggage } });
      expect(answer.status).toBe(200);
      await answer.arrayBuffer();
    }
    expect(seen).toHaveLength(2);
    // Sampled as the client's trace is (a parent-based sampler).
    expect(seen.map((lines) => lines.traceparent[0]?.slice(-2))).toEqual(['01', '00']);
    for (const lines of seen) {
      // One traceparent, the gateway's own span in the client's trace.
      expect(lines.traceparent).toHaveLength(1);
      expect(lines.traceparent[0]).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-0[01]$`));
      expect(lines.traceparent[0]).not.toContain('00f067aa0ba902b7');
      expect([lines.tracestate, lines.baggage]).toEqual([[], []]);
    }
  }
});
