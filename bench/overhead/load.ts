/**
 * The two load generators: autocannon (closed loop, no pipelining) for saturation and one
 * connection, and a paced open-loop generator for a fixed rate ("half load"), whose
 * latencies are measured from each request's scheduled start so a stall is not hidden
 * (no coordinated omission). Both check every response's echoed rank.
 */
import { Agent, request } from 'node:http';
import autocannon from 'autocannon';
import { quantileSorted } from '../lib/stats';

/** How one response's echoed rank (`x-echo-rank`) is judged. */
export type RankExpectation = { kind: 'routable'; ranks: ReadonlySet<string> } | { kind: 'none' };

export interface RankTally {
  /** Responses whose rank was checked (every response). */
  checked: number;
  /** Responses whose rank was not what the contender must send. */
  wrong: number;
  /** A few of the wrong values, for the report. */
  wrongSamples: string[];
  /** Responses per echoed rank value. */
  byRank: Record<string, number>;
}

export interface LoadResult {
  /** Seconds actually measured. */
  seconds: number;
  responses: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  non2xx: number;
  errors: number;
  timeouts: number;
  rank: RankTally;
}

export interface LoadSpec {
  url: string;
  /** Request bodies, cycled per connection. */
  bodies: readonly Buffer[];
  /** Extra headers per body variant (same index as `bodies`). */
  headers: readonly Record<string, string>[];
  expect: RankExpectation;
}

function newTally(): RankTally {
  return { checked: 0, wrong: 0, wrongSamples: [], byRank: {} };
}

function judge(tally: RankTally, value: string | undefined, expect: RankExpectation): void {
  tally.checked++;
  const shown = value ?? '(no x-echo-rank)';
  tally.byRank[shown] = (tally.byRank[shown] ?? 0) + 1;
  const ok = expect.kind === 'none' ? value === 'none' : value !== undefined && expect.ranks.has(value);
  if (!ok) {
    tally.wrong++;
    if (tally.wrongSamples.length < 5) tally.wrongSamples.push(shown);
  }
}

function echoedRank(rawHeaders: readonly string[]): string | undefined {
  let value: string | undefined;
  for (let index = 0; index < rawHeaders.length; index += 2) {
    const name = rawHeaders[index];
    if (name.length === 11 && name.toLowerCase() === 'x-echo-rank') {
      // Two echo headers would mean the contender duplicated the upstream's answer.
      if (value !== undefined) return `duplicate:${value},${rawHeaders[index + 1]}`;
      value = rawHeaders[index + 1];
    }
  }
  return value;
}

/** Closed-loop load with autocannon: `connections` clients, each one request at a time. */
export function runAutocannon(spec: LoadSpec, connections: number, seconds: number): Promise<LoadResult> {
  const tally = newTally();
  const latencies: number[] = [];
  return new Promise((resolve, reject) => {
    const instance = autocannon(
      {
        url: `${spec.url}/v1/completions`,
        connections,
        pipelining: 1,
        duration: seconds,
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        requests: spec.bodies.map((body, index) => ({
          method: 'POST',
          path: '/v1/completions',
          headers: { 'content-type': 'application/json', ...spec.headers[index] },
          body,
        })),
        setupClient(client: { on(event: 'headers', listener: (info: { headers: string[] }) => void): void }) {
          client.on('headers', (info) => judge(tally, echoedRank(info.headers), spec.expect));
        },
      },
      (error: Error | null, result: autocannon.Result) => {
        if (error) {
          reject(error);
          return;
        }
        latencies.sort((a, b) => a - b);
        const responses = latencies.length;
        const measured = result.duration > 0 ? result.duration : seconds;
        resolve({
          seconds: measured,
          responses,
          rps: responses / measured,
          p50Ms: quantileSorted(latencies, 0.5),
          p99Ms: quantileSorted(latencies, 0.99),
          non2xx: result.non2xx,
          errors: result.errors,
          timeouts: result.timeouts,
          rank: tally,
        });
      },
    );
    instance.on('response', (_client: unknown, _status: number, _bytes: number, responseTime: number) => {
      latencies.push(responseTime);
    });
  });
}

/**
 * Open-loop load at `rate` requests per second for `seconds`: requests are due at fixed
 * intervals and sent on a keep-alive pool (up to `maxSockets` at once); each latency runs
 * from when the request was due to the end of its response.
 */
export function runPaced(spec: LoadSpec, rate: number, seconds: number, maxSockets = 64): Promise<LoadResult> {
  const agent = new Agent({ keepAlive: true, maxSockets });
  const tally = newTally();
  const latencies: number[] = [];
  const total = Math.max(1, Math.round(rate * seconds));
  const interval = 1000 / rate;
  const target = new URL(`${spec.url}/v1/completions`);
  let sent = 0;
  let settled = 0;
  let non2xx = 0;
  let errors = 0;
  return new Promise((resolve) => {
    const started = performance.now();
    let finished = false;
    // A contender that stops answering must not hang the benchmark: what has not settled by
    // then counts as errors.
    const deadline = setTimeout(() => {
      errors += total - settled;
      finish();
    }, (seconds + 15) * 1000);
    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(deadline);
      agent.destroy();
      latencies.sort((a, b) => a - b);
      const measured = (performance.now() - started) / 1000;
      resolve({
        seconds: measured,
        responses: latencies.length,
        rps: latencies.length / measured,
        p50Ms: quantileSorted(latencies, 0.5),
        p99Ms: quantileSorted(latencies, 0.99),
        non2xx,
        errors,
        timeouts: 0,
        rank: tally,
      });
    };
    const send = (index: number) => {
      const due = started + index * interval;
      const variant = index % spec.bodies.length;
      const body = spec.bodies[variant];
      const req = request(
        {
          agent,
          host: target.hostname,
          port: target.port,
          path: target.pathname,
          method: 'POST',
          headers: { 'content-type': 'application/json', 'content-length': body.length, ...spec.headers[variant] },
        },
        (res) => {
          const rawHeaders = res.rawHeaders;
          res.on('data', () => undefined);
          res.on('end', () => {
            if (res.statusCode !== 200) non2xx++;
            latencies.push(performance.now() - due);
            judge(tally, echoedRank(rawHeaders), spec.expect);
            if (++settled === total) finish();
          });
        },
      );
      req.on('error', () => {
        errors++;
        if (++settled === total) finish();
      });
      req.end(body);
    };
    const tick = () => {
      const due = Math.min(total, Math.floor((performance.now() - started) / interval) + 1);
      while (sent < due) send(sent++);
      if (sent < total) setTimeout(tick, Math.max(0, Math.min(1, interval)));
    };
    tick();
  });
}
