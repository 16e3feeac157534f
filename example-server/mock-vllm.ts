/**
 * An embedded mock of a vLLM OpenAI-compatible server running data parallelism, for the
 * example gateway, the tests and the benchmarks. It behaves like vLLM wherever a gateway can
 * tell (rank header parsing, error shapes, SSE format, `/metrics` names), with no model behind
 * it: answers are deterministic filler that names the rank that served them. The rank header
 * is an index from 0 into the engines it manages (`startRank` … `startRank + dataParallelSize
 * − 1`), as vLLM's API server reads it in every load-balancing mode, and only on the paths
 * vLLM routes by it (mock-vllm/self-balanced.ts).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { MockEngine, type RankState } from './mock-vllm/engine';
import { resolveKvEventsOptions, startEngineEvents, type EngineEvents, type KvEventsConfig } from './mock-vllm/engine-events';
import { dieAfterFlush, pathOf, readJsonBody, sendError, sendJson, sendStreamError, SSE_HEADERS } from './mock-vllm/http';
import { renderMetrics } from './mock-vllm/metrics';
import { adapterOf, unknownModelMessage } from './mock-vllm/models';
import {
  completionBody,
  isProblem,
  parseGenerationRequest,
  SseStream,
  type Generation,
  type GenerationKind,
} from './mock-vllm/openai';
import { RequestLog, rankHeaderCopies } from './mock-vllm/request-log';
import { SeqLimit } from './mock-vllm/max-num-seqs';
import { RequestTimer, SseWriter } from './mock-vllm/stream-writer';
import { mockTokenizer, serveTokenize } from './mock-vllm/tokenize';
import { PdRole, type PdAdmission } from './mock-vllm/pd-roles';
import { MockScheduler, resolveSchedulerOptions, type SchedulerConfig } from './mock-vllm/scheduler';
import { serveTimed } from './mock-vllm/timed-generation';
import { SELF_BALANCED_PATHS, serveSelfBalanced } from './mock-vllm/self-balanced';
import type { PromptTokenizer } from '../lib/exact-prefix/tokenizer/tokenizer';
import type { MockFault, MockRequestRecord, MockVllm, MockVllmOptions } from './mock-vllm/types';

export type {
  MockFault,
  MockKvEvents,
  MockKvEventsOptions,
  MockRankStats,
  MockRequestRecord,
  MockSchedulerOptions,
  MockVllm,
  MockVllmOptions,
  MockVllmStats,
} from './mock-vllm/types';
export { parsePythonInt } from './mock-vllm/python-int';
export { MOCK_TOKENIZER_DIR } from './mock-vllm/tokenize';

const REQUEST_LOG_SIZE = 10_000;

type MockConfig = Required<Omit<MockVllmOptions, 'kvEvents' | 'scheduler'>> & { kvEvents: KvEventsConfig | null; scheduler: SchedulerConfig | null };
/** The `ignoreRankHeader` test hook's setting. */
type IgnoredHeader = MockVllm['ignoreRankHeader'];
/** Faults `injectFault` answers in place of the route; the others shape the route's own answer. */
type InjectedFault = Exclude<MockFault, { kind: 'die-mid-stream' } | { kind: 'eos' }>;

interface ServerContext {
  readonly config: MockConfig;
  readonly engine: MockEngine;
  readonly log: RequestLog;
  /** Set with `kvEvents`: prompts are tokenized as vLLM does. */
  readonly tokenizer: PromptTokenizer | undefined;
  readonly currentFault: () => MockFault | undefined;
  /** The `ignoreRankHeader` hook, as set now. */
  readonly ignoredHeader: () => IgnoredHeader;
  /** Set with `role` other than `'both'`: the prefill or decode leg's checks. */
  readonly pd: PdRole | undefined;
  readonly seqs: SeqLimit;
  /** Set with `scheduler`: the timed engine every generation runs on. */
  readonly scheduler: MockScheduler | undefined;
}

type RouteHandler = (ctx: ServerContext, req: IncomingMessage, res: ServerResponse, record: MockRequestRecord) => unknown;

const ROUTES = new Map<string, { method: string; handle: RouteHandler }>([
  ['/v1/completions', { method: 'POST', handle: (ctx, req, res, record) => serveGeneration('completions', ctx, req, res, record) }],
  ['/v1/chat/completions', { method: 'POST', handle: (ctx, req, res, record) => serveGeneration('chat', ctx, req, res, record) }],
  ['/v1/models', { method: 'GET', handle: serveModels }],
  ['/health', { method: 'GET', handle: serveHealth }],
  ['/metrics', { method: 'GET', handle: serveMetrics }],
  ['/tokenize', { method: 'POST', handle: (ctx, req, res) => serveTokenize(ctx.config.model, ctx.config.maxModelLen, req, res) }],
  ...[...SELF_BALANCED_PATHS].map(([path, kind]): [string, { method: string; handle: RouteHandler }] => [
    path,
    { method: 'POST', handle: (ctx, req, res) => serveSelfBalanced(kind, ctx.config.model, ctx.engine, req, res) },
  ]),
]);

/** Starts a mock vLLM data-parallel server; resolves once it listens. */
export async function startMockVllm(options: MockVllmOptions = {}): Promise<MockVllm> {
  const config = resolveOptions(options);
  // Loaded before anything binds, so a missing tokenizer package fails the start cleanly.
  const tokenizer = config.kvEvents ? mockTokenizer() : undefined;
  const ranks = Array.from({ length: config.dataParallelSize }, (_, index) => config.startRank + index);
  const events: EngineEvents | undefined = config.kvEvents ? await startEngineEvents(config.kvEvents, ranks, config.blockTokens) : undefined;
  const engine = new MockEngine({ ...config, publishKvEvents: events?.publish });
  const log = new RequestLog(REQUEST_LOG_SIZE);
  let fault: MockFault | undefined;
  let ignoredHeader: IgnoredHeader;
  const pd = config.role === 'both' ? undefined : new PdRole(config.role, config.connector, ranks, config.blockTokens, config.kvLeaseMs);
  // The timed engine keeps its own running limit and waiting queue, as vLLM's scheduler does.
  const scheduler = config.scheduler ? new MockScheduler(config.scheduler) : undefined;
  const seqs = new SeqLimit(scheduler ? Infinity : config.maxNumSeqs);
  const ctx: ServerContext = { config, engine, log, tokenizer, currentFault: () => fault, ignoredHeader: () => ignoredHeader, pd, seqs, scheduler };

  const server = createServer((req, res) => handleRequest(ctx, req, res));
  const sockets = trackSockets(server);
  try {
    await listen(server, config.port, config.host);
  } catch (error) {
    await events?.close();
    throw error;
  }
  const port = (server.address() as AddressInfo).port;
  const bootstrap = pd && config.role === 'prefill' && config.connector === 'mooncake' ? await pd.startBootstrap(config.host, config.bootstrapPort) : undefined;
  let closing: Promise<void> | undefined;

  return {
    url: `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`,
    port,
    kvEvents: events?.info,
    bootstrapPort: bootstrap?.port,
    engineIds: pd?.engines,
    close: () => (closing ??= Promise.all([closeServer(server, sockets), events?.close(), bootstrap?.close(), scheduler?.close()]).then(() => undefined)),
    stats: () => {
      const perRank = engine.snapshot();
      // Only with `maxNumSeqs`: the counters of a mock without it stay as they were.
      if (config.maxNumSeqs !== Infinity) {
        for (const rank of engine.ranks) Object.assign(perRank[rank.globalRank], { waiting: seqs.waiting(rank.globalRank), peakConcurrent: seqs.peak(rank.globalRank) });
      }
      if (scheduler) engine.ranks.forEach((rank, local) => (perRank[rank.globalRank].waiting = scheduler.waiting(local)));
      return { perRank, requests: log.snapshot() };
    },
    resetStats: () => {
      engine.resetCounters();
      seqs.resetPeaks();
      log.clear();
    },
    get fault() {
      return fault;
    },
    set fault(next: MockFault | undefined) {
      fault = next;
    },
    get ignoreRankHeader() {
      return ignoredHeader;
    },
    set ignoreRankHeader(next: IgnoredHeader) {
      ignoredHeader = next;
    },
    dropBlocksSilently(rank?: number) {
      for (const state of engine.ranks) if (rank === undefined || state.globalRank === rank) (state.cache as { dropSilently?: () => void }).dropSilently?.();
    },
    schedulerState(rank: number) {
      const local = engine.ranks.findIndex((state) => state.globalRank === rank);
      return scheduler === undefined || local < 0 ? undefined : scheduler.inspect(local);
    },
  };
}

function resolveOptions(options: MockVllmOptions): MockConfig {
  const config: MockConfig = {
    host: options.host ?? '127.0.0.1',
    port: options.port ?? 0,
    dataParallelSize: options.dataParallelSize ?? 4,
    startRank: options.startRank ?? 0,
    model: options.model ?? 'mock-model',
    prefillMsPerToken: options.prefillMsPerToken ?? 0,
    decodeMsPerToken: options.decodeMsPerToken ?? 0,
    cacheBlocksPerRank: options.cacheBlocksPerRank ?? 4096,
    blockTokens: options.blockTokens ?? 16,
    maxModelLen: options.maxModelLen ?? 131_072,
    role: options.role ?? 'both',
    connector: options.connector ?? 'nixl',
    bootstrapPort: options.bootstrapPort ?? 0,
    recordBodies: options.recordBodies ?? false,
    maxNumSeqs: options.maxNumSeqs ?? Infinity,
    kvLeaseMs: options.kvLeaseMs ?? 30_000,
    loraModules: options.loraModules ?? [],
    promptTokensDetails: options.promptTokensDetails ?? true,
    cpuBlocksPerRank: options.cpuBlocksPerRank ?? 0,
    kvEvents: null,
    scheduler: null,
  };
  const integers = { port: 0, dataParallelSize: 1, startRank: 0, cacheBlocksPerRank: 1, blockTokens: 1, maxModelLen: 1, bootstrapPort: 0, kvLeaseMs: 1, cpuBlocksPerRank: 0 };
  for (const [name, minimum] of Object.entries(integers)) {
    const value = config[name as keyof typeof integers];
    if (!Number.isSafeInteger(value) || value < minimum) {
      throw new TypeError(`startMockVllm: ${name} must be an integer >= ${minimum}, got ${String(value)}`);
    }
  }
  for (const name of ['prefillMsPerToken', 'decodeMsPerToken'] as const) {
    if (!(config[name] >= 0 && Number.isFinite(config[name]))) {
      throw new TypeError(`startMockVllm: ${name} must be a finite number >= 0, got ${String(config[name])}`);
    }
  }
  if (!['prefill', 'decode', 'both'].includes(config.role)) throw new TypeError(`startMockVllm: role must be 'prefill', 'decode' or 'both', got ${String(config.role)}`);
  if (config.connector !== 'nixl' && config.connector !== 'mooncake') throw new TypeError(`startMockVllm: connector must be 'nixl' or 'mooncake', got ${String(config.connector)}`);
  if (!(config.maxNumSeqs >= 1) || (config.maxNumSeqs !== Infinity && !Number.isSafeInteger(config.maxNumSeqs))) {
    throw new TypeError(`startMockVllm: maxNumSeqs must be an integer >= 1, got ${String(config.maxNumSeqs)}`);
  }
  if (!Array.isArray(config.loraModules) || config.loraModules.some((name) => typeof name !== 'string' || name === '' || name === config.model)) {
    throw new TypeError(`startMockVllm: loraModules must be adapter names other than the served model's, such as ['sql-lora'], got ${JSON.stringify(config.loraModules)}`);
  }
  if ('headerMode' in options) {
    throw new TypeError('startMockVllm: headerMode is gone: vLLM reads X-data-parallel-rank as an index from 0 into the engines a server manages in every mode, and so does the mock');
  }
  if (options.kvEvents !== undefined) {
    config.kvEvents = resolveKvEventsOptions(options.kvEvents, config.startRank + config.dataParallelSize - 1);
  }
  if (config.cpuBlocksPerRank > 0 && config.kvEvents === null) {
    throw new TypeError('startMockVllm: cpuBlocksPerRank needs kvEvents (the CPU tier keeps token blocks): add kvEvents: {}');
  }
  if (config.cpuBlocksPerRank > 0 && config.kvEvents?.offload) {
    throw new TypeError('startMockVllm: kvEvents.offload publishes stores of a CPU tier the mock does not keep; with cpuBlocksPerRank the tier publishes its own events: drop offload');
  }
  if (options.scheduler !== undefined) {
    for (const name of ['prefillMsPerToken', 'decodeMsPerToken'] as const) {
      if (options[name] !== undefined) throw new TypeError(`startMockVllm: ${name} times requests one by one; with scheduler the steps are timed by scheduler.stepMs, stepMsPerSeq and prefillMsPerToken: drop ${name}`);
    }
    config.scheduler = resolveSchedulerOptions(options.scheduler, config.dataParallelSize, config.maxNumSeqs);
  }
  return config;
}

function trackSockets(server: Server): Set<Socket> {
  const sockets = new Set<Socket>();
  server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  return sockets;
}

function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

function closeServer(server: Server, sockets: Set<Socket>): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    for (const socket of sockets) socket.destroy();
  });
}

function handleRequest(ctx: ServerContext, req: IncomingMessage, res: ServerResponse): void {
  // Hostile input or a bug costs one request, never the process.
  res.on('error', () => {});
  try {
    const pending = routeRequest(ctx, req, res);
    if (pending instanceof Promise) pending.catch(() => abandon(res));
  } catch {
    abandon(res);
  }
}

function abandon(res: ServerResponse): void {
  if (res.headersSent) res.destroy();
  else sendError(res, 500, 'Internal mock error', null, { connection: 'close' });
}

function routeRequest(ctx: ServerContext, req: IncomingMessage, res: ServerResponse): unknown {
  const path = pathOf(req.url);
  const record = ctx.log.add(req.method ?? '', path, rankHeaderCopies(req.rawHeaders));
  const fault = ctx.currentFault();
  if (fault && fault.kind !== 'die-mid-stream' && fault.kind !== 'eos') return injectFault(fault, req, res);
  const route = ROUTES.get(path);
  if (!route) return sendError(res, 404, `Not Found: ${path}`);
  if (req.method !== route.method) return sendError(res, 405, 'Method Not Allowed');
  return route.handle(ctx, req, res, record);
}

function injectFault(fault: InjectedFault, req: IncomingMessage, res: ServerResponse): void {
  switch (fault.kind) {
    case 'status':
      return sendError(res, fault.status, `Injected fault: HTTP ${fault.status}`);
    case 'reset':
      // An RST, as from a crashed process, rather than a polite FIN.
      return void req.socket.resetAndDestroy();
    case 'stall':
      // Drain the body so the client finishes sending and waits for an answer that never comes.
      return void req.resume();
  }
}

function serveHealth(_ctx: ServerContext, _req: IncomingMessage, res: ServerResponse): void {
  res.writeHead(200, { 'content-length': 0 });
  res.end();
}

function serveModels(ctx: ServerContext, _req: IncomingMessage, res: ServerResponse): void {
  const { model, maxModelLen } = ctx.config;
  const created = Math.floor(Date.now() / 1000);
  const card = { id: model, object: 'model', created, owned_by: 'vllm', root: model, parent: null, max_model_len: maxModelLen };
  // Adapters follow the base model, their parent (models/serving.py show_available_models).
  const adapters = ctx.config.loraModules.map((name) => ({ id: name, object: 'model', created, owned_by: 'vllm', root: `/adapters/${name}`, parent: model, max_model_len: null }));
  sendJson(res, 200, JSON.stringify({ object: 'list', data: [card, ...adapters] }));
}

function serveMetrics(ctx: ServerContext, _req: IncomingMessage, res: ServerResponse): void {
  const { scheduler, engine } = ctx;
  const waiting = scheduler ? (rank: number) => scheduler.waiting(rank - ctx.config.startRank) : (rank: number) => ctx.seqs.waiting(rank);
  const text = renderMetrics(ctx.config.model, engine.ranks, waiting);
  res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

async function serveGeneration(
  kind: GenerationKind,
  ctx: ServerContext,
  req: IncomingMessage,
  res: ServerResponse,
  record: MockRequestRecord,
): Promise<void> {
  const read = await readJsonBody(req, res);
  if (read === undefined) return;
  const unknownModel = unknownModelMessage(ctx.config.model, read.body, ctx.config.loraModules);
  if (unknownModel !== undefined) return sendError(res, 404, unknownModel, 'model');
  if (ctx.config.recordBodies) {
    record.headers = { ...req.headers };
    record.body = read.raw.toString('utf8');
  }
  const request = parseGenerationRequest(kind, read.body, ctx.config.maxModelLen, ctx.tokenizer);
  if (isProblem(request)) return sendError(res, 400, request.message, request.param);

  const asked = ctx.engine.resolveRankHeader(record.rankHeaders[0]);
  if (asked.kind === 'out_of_range') {
    return request.stream ? sendStreamError(res, asked.message) : sendError(res, 400, asked.message);
  }
  if (res.destroyed) return;
  const rank = asked.kind === 'rank' && !headerIgnored(ctx.ignoredHeader(), kind, asked.rank.globalRank) ? asked.rank : ctx.engine.pickLeastLoaded();
  const eos = ctx.currentFault()?.kind === 'eos';
  let leg: PdAdmission | undefined;
  if (ctx.pd !== undefined) {
    const requestId = req.headers['x-request-id'];
    leg = await ctx.pd.admit(read.body as Record<string, unknown>, rank.globalRank, typeof requestId === 'string' ? requestId : undefined, promptTokensOf(request), eos);
    record.leg = leg.kind;
    if (leg.kind === 'refused') return sendError(res, 400, leg.message, 'kv_transfer_params');
    if (leg.kind === 'failed') return request.stream ? sendStreamError(res, leg.message, 500) : sendError(res, 500, leg.message);
    if (res.destroyed) return;
  }
  // Past `maxNumSeqs` the request waits for a seat in the rank's own queue, as in vLLM.
  const seated = ctx.seqs.seat(rank.globalRank, res);
  if (seated !== true && !(await seated)) return;
  const adapter = adapterOf(read.body, ctx.config.loraModules);
  const salt = (read.body as { cache_salt?: unknown }).cache_salt;
  const cacheSalt = typeof salt === 'string' && salt !== '' ? salt : undefined;
  if (ctx.scheduler) {
    record.rank = rank.globalRank;
    const fault = ctx.currentFault();
    const eventBudget = fault?.kind === 'die-mid-stream' ? fault.afterChunks : Infinity;
    const model = adapter?.name ?? ctx.config.model;
    return serveTimed({ scheduler: ctx.scheduler, engine: ctx.engine, rank, request, adapter, cacheSalt, model, reportsCached: ctx.config.promptTokensDetails, leg, eos, eventBudget, res });
  }
  const admitted = ctx.engine.admit(rank, request.prompts, request.tokenIds, adapter, cacheSalt);
  const { promptTokens } = admitted;
  // The decode of a transfer read the prompt's KV cache from the prefill: nothing left to compute.
  // What usage reports as cached counts the CPU tier's hits too (prefill_stats: vllm/v1/metrics/stats.py:266 at 52a31cc).
  const cachedTokens = leg?.kind === 'decode' ? promptTokens : admitted.cachedTokens + admitted.cpuCachedTokens;
  record.rank = rank.globalRank;
  const timer = releaseOnClose(ctx, rank, res);

  const generation: Generation = { request, model: adapter?.name ?? ctx.config.model, rank: rank.globalRank, promptTokens, cachedTokens, reportsCached: ctx.config.promptTokensDetails };
  // Tokens loaded from the CPU tier cost a sixth of computing them (the timed engine's default ratio).
  const loadedTokens = leg?.kind === 'decode' ? 0 : admitted.cpuCachedTokens;
  const prefillMs = ctx.config.prefillMsPerToken * (promptTokens - cachedTokens + loadedTokens / 6);
  const rankHeader = { 'x-mock-rank': String(rank.globalRank) };
  if (!request.stream) {
    const generateMs = prefillMs + ctx.config.decodeMsPerToken * request.maxTokens;
    return timer.after(generateMs, () => {
      let text = completionBody(generation);
      if (eos) text = text.replace(/"finish_reason":"length"/g, '"finish_reason":"stop"');
      if (leg?.kind === 'prefill') {
        leg.commit();
        // vLLM's answers carry the parameters as a top-level member.
        text = `${text.slice(0, -1)},"kv_transfer_params":${leg.params ?? 'null'}}`;
      }
      sendJson(res, 200, text, rankHeader);
    });
  }
  if (leg?.kind === 'prefill') timer.after(prefillMs, leg.commit);
  // Like vLLM behind uvicorn, the stream's headers leave at once; the first event waits for prefill.
  res.writeHead(200, { ...SSE_HEADERS, ...rankHeader });
  res.flushHeaders();
  const fault = ctx.currentFault();
  const eventBudget = fault?.kind === 'die-mid-stream' ? fault.afterChunks : Infinity;
  if (eventBudget <= 0) return dieAfterFlush(res);
  const writer = new SseWriter(res, new SseStream(generation), ctx.config.decodeMsPerToken, timer, eventBudget);
  timer.after(prefillMs, writer.run);
}

/** Whether the `ignoreRankHeader` hook has the request placed as without a header. */
function headerIgnored(ignored: IgnoredHeader, kind: GenerationKind, rank: number): boolean {
  if (ignored === undefined) return false;
  const path = kind === 'chat' ? '/v1/chat/completions' : '/v1/completions';
  return (ignored.paths?.includes(path) ?? false) || (ignored.ranks?.includes(rank) ?? false);
}

/** Frees the rank's slot exactly once when the response ends or the client goes, and stops its timer. */
function releaseOnClose(ctx: ServerContext, rank: RankState, res: ServerResponse): RequestTimer {
  const timer = new RequestTimer();
  res.once('close', () => {
    timer.cancel();
    ctx.engine.release(rank);
  });
  return timer;
}

// Run as a command (`npx tsx example-server/mock-vllm.ts --port 8000`): a mock upstream for library users.
if (require.main === module) {
  void import('./mock-vllm/command').then(({ runMockCommand }) => runMockCommand(process.argv.slice(2)));
}

/** The prompt tokens a prefill computes (for its block count), before the cache is consulted. */
function promptTokensOf(request: { prompts: string[]; tokenIds?: number[][] }): number {
  if (request.tokenIds) return request.tokenIds.reduce((sum, ids) => sum + ids.length, 0);
  return request.prompts.reduce((sum, prompt) => sum + Math.ceil(prompt.length / 4), 0);
}
