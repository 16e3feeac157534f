/**
 * The throwaway consumer projects, as users would write them. They are kept as text so the
 * repository's own typecheck never sees them: they import `express-dp-router` by name, which
 * resolves only inside the consumer directory, against the packed tarball.
 */

/**
 * One scenario, run by the CommonJS and the ESM consumer on Express 5 and on Express 4: a
 * tiny upstream on 127.0.0.1:0, then (1) the default export `dpRouter` mounted under `/v1`
 * and (2) `dpRank` in front of a hand-written node:http forwarder. Each gets one request
 * carrying two client copies of the rank header. It takes the package as an argument, so
 * each consumer imports the package its own way.
 */
export const SCENARIO_CJS = String.raw`
const http = require('node:http');
const { Registry } = require('prom-client');

const listen = (server) =>
  new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve('http://127.0.0.1:' + server.address().port)));

function send(url) {
  return new Promise((resolve, reject) => {
    const client = http.request(url, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk) => (text += chunk));
      res.on('end', () => resolve({ status: res.statusCode, decision: res.headers['x-dp-router-decision'], text }));
    });
    client.setHeader('X-Data-Parallel-Rank', ['6', '+3']);
    client.on('error', reject);
    client.end(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }));
  });
}

async function run(express, lib) {
  const seen = [];
  const upstream = http.createServer((req, res) => {
    const lines = [];
    for (let i = 0; i < req.rawHeaders.length; i += 2) {
      if (req.rawHeaders[i].toLowerCase() === 'x-data-parallel-rank') lines.push(req.rawHeaders[i + 1]);
    }
    seen.push({ url: req.url, lines });
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"ok":true}');
    });
  });
  const upstreamUrl = await listen(upstream);
  const upstreams = [{ url: upstreamUrl, name: 'node-a', dataParallelSize: 8, ranks: [0, 2, 4, 6] }];

  const router = lib.default({ upstreams, metrics: { registry: new Registry() }, exposeDecision: true });
  const routerApp = express();
  routerApp.get('/metrics', router.metrics);
  routerApp.use('/v1', router);
  const routerServer = http.createServer(routerApp);
  const routerUrl = await listen(routerServer);
  const routed = await send(routerUrl + '/v1/chat/completions');
  const metrics = await new Promise((resolve) =>
    http.get(routerUrl + '/metrics', (res) => {
      let text = '';
      res.on('data', (chunk) => (text += chunk));
      res.on('end', () => resolve(text));
    }),
  );
  const routerSeen = seen.splice(0);

  const decisions = [];
  const rank = lib.dpRank({ upstreams, metrics: false });
  const rankApp = express();
  rankApp.use(rank);
  rankApp.use((req, res) => {
    decisions.push(req.dpRank);
    const forward = http.request(req.dpRank.url + req.originalUrl, { method: req.method, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    });
    req.pipe(forward);
  });
  const rankServer = http.createServer(rankApp);
  const rankUrl = await listen(rankServer);
  const ranked = await send(rankUrl + '/v1/chat/completions');
  await new Promise((resolve) => setTimeout(resolve, 20));
  const inflightAfter = rank.endpoints().reduce((sum, endpoint) => sum + endpoint.inflight, 0);

  for (const server of [routerServer, rankServer, upstream]) {
    server.closeAllConnections();
    server.close();
  }
  await Promise.all([router.close(), rank.close()]);
  return {
    router: { status: routed.status, decision: routed.decision, seen: routerSeen, metricsHaveRank6: metrics.includes('rank="6"') },
    rank: { status: ranked.status, seen, decision: decisions[0], inflightAfter },
  };
}

module.exports = { run };
`;

/** The CommonJS consumer: `require()`. */
export const CJS_CONSUMER = String.raw`
const lib = require('express-dp-router');
const { dpRouter, dpRank } = require('express-dp-router');
const { run } = require('../shared/scenario.cjs');

async function main() {
  let deepImport = 'allowed';
  try {
    require('express-dp-router/dist/cjs/options.js');
  } catch (error) {
    deepImport = error.code;
  }
  const facts = {
    entry: require.resolve('express-dp-router'),
    defaultIsDpRouter: lib.default === dpRouter,
    dpRankType: typeof dpRank,
    version: require('express-dp-router/package.json').version,
    deepImport,
    exportNames: Object.keys(lib).filter((name) => name !== '__esModule').sort(),
  };
  const express5 = await run(require('express'), lib);
  const express4 = await run(require('express4'), lib);
  process.stdout.write(JSON.stringify({ facts, express5, express4 }));
}
main().catch((error) => {
  console.error(error);
  process.exit(1);
});
`;

/** The ESM consumer: `import`, default and named. */
export const ESM_CONSUMER = String.raw`
import { createRequire } from 'node:module';
import express from 'express';
import express4 from 'express4';
import dpRouter, { dpRank, parseRankHint } from 'express-dp-router';
import * as lib from 'express-dp-router';
import scenario from '../shared/scenario.cjs';

const require = createRequire(import.meta.url);
const cjs = require('express-dp-router');
const facts = {
  entry: import.meta.resolve('express-dp-router'),
  defaultIsDpRouter: dpRouter === lib.dpRouter,
  sameImplementationAsRequire: lib.dpRouter === cjs.dpRouter && dpRank === cjs.dpRank,
  parsed: parseRankHint('4'),
  exportNames: Object.keys(lib).sort(),
};
const express5Result = await scenario.run(express, lib);
const express4Result = await scenario.run(express4, lib);
process.stdout.write(JSON.stringify({ facts, express5: express5Result, express4: express4Result }));
`;

export const TS_CONFIG = JSON.stringify(
  {
    compilerOptions: {
      target: 'ES2022',
      module: 'nodenext',
      moduleResolution: 'nodenext',
      strict: true,
      types: ['node'],
      outDir: 'out',
      rootDir: 'src',
    },
    include: ['src'],
  },
  null,
  2,
);

/**
 * The TypeScript consumer's ESM file (the `import` condition, `.d.mts` types): every option
 * typed, `req.dpRank` on Express 5 and Express 4 requests, and a run of both.
 */
export const TS_ESM_CONSUMER = String.raw`
import { createServer, request, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import express4 from 'express4';
import dpRouter, { dpRank, parseRankHint, type DpRankDecision, type DpRankOptions, type DpRouter, type Options, type Policy } from 'express-dp-router';
import { Registry } from 'prom-client';

const firstCandidate: Policy = { name: 'first', pick: (candidates) => candidates[0] };

function rankOptionsFor(url: string): DpRankOptions {
  return {
    upstreams: [{ url, name: 'node-a', dataParallelSize: 8, startRank: 0, ranks: [0, 2, 4, 6], rankHeader: 'global' }],
    policy: 'round-robin',
    hints: {
      trust: (req: IncomingMessage) => req.headers.authorization === 'Bearer ops',
      onInvalid: 'reject',
      header: 'x-data-parallel-rank',
      bodyField: false,
    },
    header: 'X-data-parallel-rank',
    metrics: { registry: new Registry(), prefix: 'gw_' },
    affinity: { header: 'x-session-id', bodyField: 'user' },
    timeouts: { bodyMs: 30_000 },
    maxBodyBytes: 1 << 20,
    exposeDecision: true,
  };
}
// The upstream timeouts belong to the proxy: dpRank() refuses them.
function optionsFor(url: string): Options {
  return { ...rankOptionsFor(url), timeouts: { connectMs: 5_000, firstByteMs: 60_000, bodyMs: 30_000 } };
}
const alsoValid: Options = { upstreams: [{ url: 'http://127.0.0.1:8000' }], policy: firstCandidate, metrics: false };
void alsoValid;

const listen = (server: Server) =>
  new Promise<string>((resolve) => server.listen(0, '127.0.0.1', () => resolve('http://127.0.0.1:' + (server.address() as AddressInfo).port)));

function send(url: string, hint: string): Promise<{ status: number | undefined; decision: string | string[] | undefined }> {
  return new Promise((resolve, reject) => {
    const client = request(url, { method: 'POST', headers: { authorization: 'Bearer ops', 'x-data-parallel-rank': hint } }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode, decision: res.headers['x-dp-router-decision'] }));
    });
    client.on('error', reject);
    client.end('{}');
  });
}

const seen: string[] = [];
const upstream = createServer((req, res) => {
  seen.push(String(req.headers['x-data-parallel-rank']));
  req.resume();
  req.on('end', () => res.end('{}'));
});
const upstreamUrl = await listen(upstream);

const router: DpRouter = dpRouter(optionsFor(upstreamUrl));
const app = express();
app.get('/metrics', router.metrics);
app.use('/v1', router);
const routerServer = createServer(app);
const routed = await send((await listen(routerServer)) + '/v1/completions', '4');

const decisions: DpRankDecision[] = [];
const rank = dpRank(rankOptionsFor(upstreamUrl));
const app4 = express4();
app4.use(rank);
app4.use((req: express4.Request, res: express4.Response) => {
  const decision: DpRankDecision | undefined = req.dpRank;
  decisions.push(decision!);
  const forward = request(decision!.url + req.originalUrl, { method: req.method, headers: req.headers }, (answer) => {
    res.writeHead(answer.statusCode ?? 502, answer.headers);
    answer.pipe(res);
  });
  req.pipe(forward);
});
const rankServer = createServer(app4);
const ranked = await send((await listen(rankServer)) + '/v1/completions', '6');

const express5Handler: express.RequestHandler = (req, _res, next) => {
  const rankNumber: number | undefined = req.dpRank?.rank;
  void rankNumber;
  next();
};
void express5Handler;

for (const server of [routerServer, rankServer, upstream]) {
  server.closeAllConnections();
  server.close();
}
await Promise.all([router.close(), rank.close()]);
process.stdout.write(JSON.stringify({ routed, ranked, seen, decision: decisions[0], parsed: parseRankHint('+3') }));
`;

/** The TypeScript consumer's CommonJS file (the `require` condition, `.d.ts` types). */
export const TS_CJS_CONSUMER = String.raw`
import dpRouter, { dpRank, type Options } from 'express-dp-router';

const options: Options = { upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 2 }], metrics: false };
const router = dpRouter(options);
const rank = dpRank(options);
process.stdout.write(JSON.stringify({ router: typeof router.close, rank: rank.endpoints().length }));
void Promise.all([router.close(), rank.close()]);
`;

/** Options that must not compile; each line is checked for its own error. */
export const TS_WRONG_OPTIONS = String.raw`
import { dpRouter } from 'express-dp-router';

dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000' }], policy: 'fastest' });
dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000', dataParalelSize: 8 }] });
dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000' }], hints: { trust: 'yes' } });
dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000', rankHeader: 'local-rank' }] });
`;

/**
 * A TypeScript project with the compiler's defaults (target ES5, CommonJS, `node10` resolution,
 * declaration files checked: no `skipLibCheck`), as `tsc` runs without a target: the package's
 * declarations must hold nothing newer than every target reads (a `#private` field is TS18028).
 */
export const TS_DEFAULT_CONFIG = JSON.stringify({ compilerOptions: { strict: true, esModuleInterop: true, noEmit: true, types: ['node'] } }, null, 2);

/** The default-target consumer: the README's "Mount it", typed. */
export const TS_DEFAULT_CONSUMER = String.raw`
import express from 'express';
import { dpRouter, type DpRouter } from 'express-dp-router';

const app = express();
const router: DpRouter = dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 8 }] });
app.get('/metrics', router.metrics);
app.use(router);
`;

/** A router asked for exact prefix routing where none of its optional packages is installed: what creating it throws. */
export const EXACT_ROUTING_CONSUMER = `const { dpRouter } = require('express-dp-router');
try {
  dpRouter({
    upstreams: [{ url: 'http://127.0.0.1:9', dataParallelSize: 2, kvEvents: { endpoint: 'tcp://127.0.0.1:5557' } }],
    policy: 'prefix-aware',
    prefixAware: { tokenizer: process.argv[2] },
  });
  console.log(JSON.stringify({ created: true }));
} catch (error) {
  console.log(JSON.stringify({ name: error.name, code: error.code, message: error.message }));
}
`;
