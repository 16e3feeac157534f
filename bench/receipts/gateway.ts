/**
 * One gateway of `bench:receipts`' cost comparison, as its own process:
 *
 *   gateway.ts <mock-url> <kv-events-json> <tokenizer-dir> <on|off|receipts-json>
 *
 * dpRouter on prefix-aware exact routing in front of the mock, with route receipts on (their
 * defaults), off (`receipts: false`), or as the JSON given (`{"askStreamUsage":false}`). The router comes from `DP_ROUTER_BENCH_LIB` (the compiled
 * package), by default the sources. Prints `READY <port>`.
 */
import express from 'express';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';

const library = process.env.DP_ROUTER_BENCH_LIB ?? `${__dirname}/../../lib`;
const { dpRouter } = require(library) as typeof import('../../lib');

const [mockUrl, events, tokenizer, receipts] = process.argv.slice(2);
const kvEvents = JSON.parse(events) as { endpoint: string[]; replayEndpoint: string[] };
const app = express();
app.disable('x-powered-by');
app.use(
  dpRouter({
    upstreams: [{ url: mockUrl, name: 'mock', dataParallelSize: kvEvents.endpoint.length, kvEvents }],
    policy: 'prefix-aware',
    prefixAware: { tokenizer },
    metrics: { registry: new Registry() },
    logger: false,
    ...(receipts === 'off' ? { receipts: false } : receipts === 'on' ? {} : { receipts: JSON.parse(receipts) }),
  }),
);
const server = app.listen(0, '127.0.0.1', () => process.stdout.write(`READY ${(server.address() as AddressInfo).port}\n`));
server.keepAliveTimeout = 60_000;
process.on('SIGTERM', () => process.exit(0));
process.stdout.on('error', () => undefined);
