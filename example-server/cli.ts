import { Resolver } from 'node:dns';
import { existsSync } from 'node:fs';
import type { DnsUpstreamOptions, PolicyName, RankHeaderMode, UpstreamOptions } from '../lib';
import { resolveKvEndpoints } from '../lib/exact-prefix/events/endpoints';
import type { KvEventsOptions } from '../lib/exact-prefix/events/source';
import { AUTHORIZATION, redactUrl, upstreamUrlProblem } from '../lib/upstreams/upstream-url';
import { parseSpeeds, type MockTimingFlags } from './mock-vllm/timing-flags';

/** An upstream as the gateway passes it to the router, with where its KV events are published. */
export type GatewayUpstream = (UpstreamOptions | DnsUpstreamOptions) & {
  kvEvents?: KvEventsOptions;
  /**
   * Its `URL@RANKS` list does not start at 0 and no `--start-rank` was given: which engines the
   * server manages (and so each rank's header value) is read from its `/metrics` at start
   * (example-server/start-rank.ts). The flag that named it, for messages.
   */
  learnStartRank?: string;
};

/** The gateway's settings, as read from the command line and environment. */
export interface GatewaySettings {
  port: number;
  host: string;
  /** Empty: start the embedded mock vLLM (which publishes KV events the router subscribes to). */
  upstreams: GatewayUpstream[];
  /** The model's tokenizer for exact prefix routing (`prefixAware.tokenizer`); the embedded mock's by default. */
  tokenizer: string | undefined;
  /** The servers' `--default-chat-template-kwargs` (`prefixAware.chatTemplateKwargs`); `undefined`: none. */
  chatTemplateKwargs: Record<string, unknown> | undefined;
  dpSize: number;
  policy: PolicyName;
  trustHints: boolean;
  onInvalid: 'reassign' | 'reject';
  exposeDecision: boolean;
  /** Delay per generated token of the embedded mock, so streaming is visible. */
  mockDecodeMs: number;
  /**
   * The embedded mock's port (prometheus.yml scrapes it); `undefined`: {@link DEFAULT_MOCK_PORT}
   * (an error when taken), or any free port when the gateway's `port` is 0.
   */
  mockPort: number | undefined;
  /** How long SIGTERM waits for in-flight requests before exiting anyway. */
  drainTimeoutMs: number;
  /** Active health-check interval of each upstream's `/health`; 0 turns checks off. */
  healthCheckMs: number;
  /** Engine load polling interval of each upstream's `/metrics`; 0 turns it off. */
  loadFeedbackMs: number;
  /** Weight of other gateways' engine load (0–1). */
  loadFeedbackWeight: number;
  /** pino level of the gateway's log. */
  logLevel: LogLevel;
  /** OTLP/HTTP traces endpoint; `undefined`: no tracing. */
  otlpEndpoint: string | undefined;
  /** Prefill/decode disaggregation (`--pd`, `--prefill`/`--decode`); `undefined`: whole requests. */
  disaggregation: { connector: 'nixl' | 'mooncake' } | undefined;
  /** Admission control, on when any of its flags is given (example-server/admission.ts). */
  admission: AdmissionFlags;
  /** `--rank-header`, which the embedded mock gets too; `undefined`: `'local'`. */
  rankHeader?: RankHeaderMode;
  /** The embedded mock's per-rank concurrency (vLLM's --max-num-seqs); 0: no limit. */
  mockMaxNumSeqs: number;
  /** The embedded mock's timed engine and CPU tier (`--mock-speeds`, `--mock-step-ms`, `--mock-cpu-blocks`). */
  mockTiming: MockTimingFlags;
  /** `prefixAware.placementSlack`; `undefined`: the policy's default. */
  placementSlack: number | undefined;
  /**
   * The other replicas (`--peer-listen`, `--peer`, or `--peer-redis` through the `--redis` URL;
   * `DP_ROUTER_PEER_SECRET`); `undefined`: off.
   */
  peers: { listen?: string; addresses: string[]; dns?: { name: string; port: number }; redis?: true; secret: string } | undefined;
  /** SLO-aware routing (`--slo-ttft-ms`, `--slo-tpot-ms`, `--trust-slo`, `--slo-shed`); `undefined`: off. */
  slo?: { ttftMs?: number; tpotMs?: number; trust?: boolean; shed?: boolean };
}

/** The admission flags; `undefined` where not given. */
export interface AdmissionFlags {
  maxInflightPerRank?: number;
  queueMax?: number;
  queueTimeoutMs?: number;
  tenantHeader?: string;
  /** `--trust-tenant`: every caller's tenant header is honoured; `undefined`: as `--trust-hints`. */
  trustTenant?: boolean;
  tokensPerMinute?: number;
  redisUrl?: string;
}

/** Where the embedded mock listens unless `--mock-port` says otherwise: beside the gateway's 30000. */
export const DEFAULT_MOCK_PORT = 30001;

/** pino's levels. */
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
const LOG_LEVELS: readonly LogLevel[] = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

/** A command line the gateway cannot run with; the message is one line. */
export class UsageError extends Error {}

export const USAGE = `Usage: npm start -- [options]

An express-dp-router gateway in front of vLLM data-parallel servers. Without --upstream it
starts an embedded mock vLLM on loopback, so it works without a GPU.

Options:
  --port N              gateway port (env PORT)                          [30000]
  --host H              bind address (env HOST)                          [127.0.0.1]
  --upstream URL[@RANKS]
                        a vLLM server; RANKS like 0,2,4,6 or 4-7 (global ranks).
                        Repeatable; a URL given again adds ranks (vllm-router's URL@RANK).
                        Without @RANKS it serves --start-rank … + --dp-size − 1. A list
                        not starting at 0 is checked against the engine="N" labels of the
                        server's /metrics at start, which say its first engine (0 for
                        vllm serve --data-parallel-size N, the node's start rank for a
                        hybrid node); unreadable, give --start-rank
  --dp-size N           ranks of every upstream given without @RANKS (one value for
                        all), and of the mock (vLLM's --data-parallel-size) [4]
  --start-rank N        first engine (global rank) of every upstream: the servers'
                        --data-parallel-start-rank (also accepted under that name)
                                                [0; with URL@RANKS, read from /metrics]
  --rank-header MODE    local: rank − start rank, the index vLLM reads in every mode
                        (internal, hybrid and external LB) | global | none (no header:
                        one server per rank). The embedded mock gets it too:
                        with none it balances its engines itself, as vLLM does [local]
  --upstream-dns NAME:PORT[@RANKS]
                        every address NAME resolves to (A and AAAA: a Kubernetes
                        headless Service) is a vLLM server on PORT, re-resolved every 10 s;
                        each is named NAME/ADDRESS (NAME:PORT/ADDRESS for a NAME given with
                        two ports). Repeatable; a NAME:PORT given again adds ranks.
  --dns-server ADDR     the DNS server --upstream-dns asks, e.g. 10.96.0.10 or
                        127.0.0.1:5353; repeatable                       [the system's]
  --model NAME          the --upstream (or --upstream-dns) before it serves model NAME;
                        repeatable. Requests then go to the servers of their "model";
                        servers given no --model serve every model
  --kv-events ENDPOINT[,REPLAY_ENDPOINT]
                        the --upstream before it publishes KV events (vLLM's
                        --kv-events-config), e.g. tcp://10.0.0.5:5557,tcp://10.0.0.5:5558:
                        rank 0's ports, offset by the global rank as vLLM does (vLLM's
                        endpoint must be tcp://*:5557: with a host it connects out)
  --tokenizer PATH      the model's tokenizer (a directory with tokenizer.json and
                        tokenizer_config.json; it must exist): with --kv-events,
                        prefix-aware routes on the engines' own KV-cache events. Only
                        --policy prefix-aware (and --pd, --prefill/--decode) reads it:
                        with another policy it is an error. The embedded mock needs neither.
  --default-chat-template-kwargs JSON
                        what the vLLM servers were started with under the same flag,
                        e.g. '{"enable_thinking": false}': the tokenizer renders chat
                        requests with it, as vLLM does (--policy prefix-aware only) [none]
  --policy NAME         least-outstanding | round-robin | random | power-of-two |
                        session-affinity | prefix-aware                  [least-outstanding]
  --trust-hints         honour valid client X-data-parallel-rank hints   [off]
  --on-invalid MODE     reassign | reject: what an invalid trusted hint gets [reassign]
  --expose-decision     answer with X-DP-Router-Decision                 [off]
  --slo-ttft-ms N       prefix-aware: every request's time-to-first-token objective;
                        routes on a latency model learned online (docs/slo-routing.md) [none]
  --slo-tpot-ms N       prefix-aware: every request's time-per-output-token objective [none]
  --trust-slo           honour every caller's x-slo-ttft-ms / x-slo-tpot-ms   [off]
  --slo-shed            answer 503 when no rank is predicted to meet the objectives [off]
  --health-check-ms N   probe each upstream's /health this often; 0 = off [0]
  --discover            learn each upstream's ranks from its /metrics engine labels
  --load-feedback-ms N  blend engine load from each upstream's /metrics, polled
                        this often; 0 = off                              [0]
  --load-feedback-weight W
                        weight of other gateways' engine load, 0 to 1    [0.5]
  --placement-slack N   prefix-aware: how many of a prompt's own prefills longer than the
                        shortest a queue may be and still take a new prefix by its
                        rendezvous order; 0 with --kv-events and --peer   [4]
  --peer-listen HOST:PORT
                        announce this replica's load to the --peer replicas over UDP, and
                        hear theirs here; the secret comes from DP_ROUTER_PEER_SECRET
                        (16+ characters, the same on every replica)       [off]
  --peer HOST:PORT      another gateway replica's --peer-listen (repeatable; may list this one)
  --peer-dns NAME:PORT  the replicas by DNS: every address of NAME (a headless Service over the
                        gateway pods), re-resolved every 10 s
  --peer-redis          announce and hear the replicas' load on the Redis server's pub/sub
                        channel dp-router:peers instead of UDP: --redis URL, or env
                        DP_ROUTER_REDIS_URL (DP_ROUTER_PEER_SECRET as above)
  --prefill URL[@RANKS] a vLLM prefill server (repeatable): with --decode, each request's
                        prefill leg goes there, its decode leg to a --decode server
  --decode URL[@RANKS]  a vLLM decode server (repeatable)
  --pd-connector NAME   nixl | mooncake: the servers' KV connector        [nixl]
  --bootstrap-port N    the --prefill before it: its Mooncake bootstrap port [8998]
  --pd                  embedded mocks: one prefill server and one decode server
  --mock-decode-ms N    embedded mock: delay per generated token         [0]
  --mock-port N         embedded mock's port (prometheus.yml scrapes it); 0 = any
                        [30001 (taken: an error); any with --port 0]
  --mock-max-num-seqs N embedded mock: requests each rank runs at once (vLLM's
                        --max-num-seqs); past it they wait in the engine  [no limit]
  --mock-speeds S[,S…]  embedded mock: time every rank as vLLM's scheduler does, in steps
                        (decode slows as the batch grows, cache hits skip prefill, one chunk
                        per token), each at this relative speed, e.g. 1,1,1,0.5  [off]
  --mock-step-ms MS     embedded mock: the timed steps' fixed cost (turns timing on) [10]
  --mock-cpu-blocks N   embedded mock: a CPU tier of N blocks per rank, published as vLLM's
                        offloading connector does (medium CPU)           [off]
  --max-inflight-per-rank N
                        admission: an endpoint's capacity; past it requests wait
                        in the gateway's fair queue                      [off; 32 with
                                                                          another admission flag]
  --queue-max N         admission: requests waiting in total, then 429   [1024]
  --queue-timeout-ms N  admission: longest wait, then 503                [30000]
  --tenant-header NAME  admission: the fairness (and token budget) key, e.g. x-tenant-id,
                        honoured for trusted callers only; the others share one tenant
                                                                         [one tenant]
  --trust-tenant        admission: trust every caller's --tenant-header  [as --trust-hints]
  --tokens-per-minute N admission: each tenant's token budget, from vLLM's usage [off]
  --redis URL           admission: keep token budgets in Redis (shared by replicas),
                        e.g. redis://127.0.0.1:6379 (needs the ioredis package); with
                        --tokens-per-minute or --peer-redis, env DP_ROUTER_REDIS_URL
                        when not given (keeps a password off the command line)
  --drain-timeout-ms N  on SIGTERM, wait this long for in-flight requests [30000]
  --log-level LEVEL     fatal | error | warn | info | debug (one line per routing
                        decision) | trace | silent (env LOG_LEVEL)        [info]
  --otlp-endpoint URL   export OpenTelemetry traces over OTLP/HTTP, e.g.
                        http://127.0.0.1:4318 (/v1/traces is added to a bare URL);
                        vLLM's --otlp-traces-endpoint joins the same traces [off]
  -h, --help            print this help

A flag's value follows it or an '=': --port 8080, --port=8080. Switches (--trust-hints,
--trust-tenant, --expose-decision, --discover, --pd) take no value, or exactly =true or =false. --model,
--kv-events and --bootstrap-port belong to the --upstream (--upstream-dns, --prefill) before
them; the other flags belong to the whole gateway and are given once (--upstream and the
like may repeat): --dp-size, --start-rank and --rank-header apply to every upstream, so give a
server of another size its ranks as URL@RANKS. A flag the others leave without effect
(--tokenizer or --placement-slack without --policy prefix-aware, --on-invalid without
--trust-hints, --load-feedback-weight without --load-feedback-ms, a --mock-* flag with an
--upstream) is refused, with the reason.

Serves the proxied API under /, metrics at GET /metrics, liveness at GET /healthz and
readiness at GET /readyz. Logs with pino: pretty on a terminal, JSON lines otherwise, one
access line per proxied request with its upstream, rank and source.`;

const POLICIES: readonly PolicyName[] = ['least-outstanding', 'round-robin', 'random', 'power-of-two', 'session-affinity', 'prefix-aware'];
const RANK_HEADERS: readonly RankHeaderMode[] = ['global', 'local', 'none'];

/** What the flags build up while the command line is read. */
interface ParseState {
  settings: GatewaySettings;
  kvEvents: Map<string, KvEventsOptions>;
  discover: boolean;
  upstreamSpecs: string[];
  dnsSpecs: string[];
  dnsServers: string[];
  /** Models per upstream key (its URL, or `dns:NAME:PORT`), from `--model`. */
  models: Map<string, string[]>;
  /** The key of the last --upstream or --upstream-dns, which --model applies to. */
  lastUpstream: string | undefined;
  startRank: number | undefined;
  rankHeader: RankHeaderMode;
  help: boolean;
  /** `--prefill` and `--decode` specs, with each `--bootstrap-port` by the prefill URL before it. */
  prefillSpecs: string[];
  decodeSpecs: string[];
  bootstrapPorts: Map<string, number>;
  pd: boolean;
  connector: 'nixl' | 'mooncake' | undefined;
  /** `--peer-listen` and each `--peer`. */
  peerListen: string | undefined;
  peerAddresses: string[];
  peerDns: { name: string; port: number } | undefined;
  /** `--peer-redis`. */
  peerRedis: boolean;
}

/**
 * A flag: a switch (`--flag`, or exactly `--flag=true` / `--flag=false`: anything else is
 * refused, so `--trust-hints=false` can never turn trust on) or a flag with a non-empty value
 * (`--flag V` or `--flag=V`).
 */
type Flag = { switch: (state: ParseState, on: boolean) => void } | { value: (state: ParseState, raw: string, flag: string) => void };

/** Every flag of the gateway, in the order of `USAGE`. */
const FLAGS: Readonly<Record<string, Flag>> = {
  '--port': { value: (s, raw, flag) => (s.settings.port = integer(flag, raw, 0, 65535)) },
  '--host': { value: (s, raw) => (s.settings.host = raw) },
  '--upstream': {
    value: (s, raw) => {
      s.upstreamSpecs.push(raw);
      s.lastUpstream = parseUpstreamSpec(raw, 1).url;
    },
  },
  '--upstream-dns': {
    value: (s, raw) => {
      s.dnsSpecs.push(raw);
      const { name, port } = parseDnsSpec(raw, 1, undefined);
      s.lastUpstream = `dns:${name}:${port}`;
    },
  },
  '--dns-server': { value: (s, raw, flag) => s.dnsServers.push(dnsServer(flag, raw)) },
  '--model': {
    value: (s, raw, flag) => {
      if (s.lastUpstream === undefined) throw new UsageError(`${flag} names a model of the --upstream or --upstream-dns before it`);
      const models = s.models.get(s.lastUpstream) ?? [];
      if (!models.includes(raw)) models.push(raw);
      s.models.set(s.lastUpstream, models);
    },
  },
  '--dp-size': { value: (s, raw, flag) => (s.settings.dpSize = integer(flag, raw, 1, 65536)) },
  '--start-rank': { value: (s, raw, flag) => (s.startRank = integer(flag, raw, 0, 1_000_000)) },
  '--rank-header': { value: (s, raw, flag) => (s.rankHeader = s.settings.rankHeader = choice(flag, raw, RANK_HEADERS)) },
  '--kv-events': {
    value: (s, raw, flag) => {
      const previous = s.upstreamSpecs[s.upstreamSpecs.length - 1];
      if (previous === undefined) throw new UsageError(`${flag} names the KV events of the --upstream before it; the embedded mock's are wired without it`);
      s.kvEvents.set(parseUpstreamSpec(previous, s.settings.dpSize).url, kvEventsSpec(flag, raw));
    },
  },
  '--tokenizer': { value: (s, raw, flag) => (s.settings.tokenizer = existingPath(flag, raw)) },
  '--default-chat-template-kwargs': { value: (s, raw, flag) => (s.settings.chatTemplateKwargs = jsonObject(flag, raw)) },
  '--policy': { value: (s, raw, flag) => (s.settings.policy = choice(flag, raw, POLICIES)) },
  '--trust-hints': { switch: (s, on) => (s.settings.trustHints = on) },
  '--on-invalid': { value: (s, raw, flag) => (s.settings.onInvalid = choice(flag, raw, ['reassign', 'reject'] as const)) },
  '--expose-decision': { switch: (s, on) => (s.settings.exposeDecision = on) },
  '--slo-ttft-ms': { value: (s, raw, flag) => ((s.settings.slo ??= {}).ttftMs = integer(flag, raw, 1, 3_600_000)) },
  '--slo-tpot-ms': { value: (s, raw, flag) => ((s.settings.slo ??= {}).tpotMs = integer(flag, raw, 1, 3_600_000)) },
  '--trust-slo': { switch: (s, on) => ((s.settings.slo ??= {}).trust = on) },
  '--slo-shed': { switch: (s, on) => ((s.settings.slo ??= {}).shed = on) },
  '--health-check-ms': { value: (s, raw, flag) => (s.settings.healthCheckMs = integer(flag, raw, 0, 3_600_000)) },
  '--discover': { switch: (s, on) => (s.discover = on) },
  '--load-feedback-ms': { value: (s, raw, flag) => (s.settings.loadFeedbackMs = integer(flag, raw, 0, 3_600_000)) },
  '--load-feedback-weight': { value: (s, raw, flag) => (s.settings.loadFeedbackWeight = fraction(flag, raw)) },
  '--placement-slack': { value: (s, raw, flag) => (s.settings.placementSlack = decimal(flag, raw, 0, 1_000_000)) },
  '--peer-listen': { value: (s, raw) => (s.peerListen = raw) },
  '--peer': { value: (s, raw) => s.peerAddresses.push(raw) },
  '--peer-redis': { switch: (s, on) => (s.peerRedis = on) },
  '--peer-dns': {
    value: (s, raw, flag) => {
      const match = /^([^:]+):(\d{1,5})$/.exec(raw);
      if (match === null) throw new UsageError(`${flag} must be NAME:PORT, got ${JSON.stringify(raw)}`);
      s.peerDns = { name: match[1], port: integer(flag, match[2], 1, 65535) };
    },
  },
  '--prefill': { value: (s, raw) => s.prefillSpecs.push(raw) },
  '--decode': { value: (s, raw) => s.decodeSpecs.push(raw) },
  '--pd-connector': { value: (s, raw, flag) => (s.connector = choice(flag, raw, ['nixl', 'mooncake'] as const)) },
  '--bootstrap-port': {
    value: (s, raw, flag) => {
      const previous = s.prefillSpecs[s.prefillSpecs.length - 1];
      if (previous === undefined) throw new UsageError(`${flag} names the Mooncake bootstrap port of the --prefill before it`);
      s.bootstrapPorts.set(parseUpstreamSpec(previous, s.settings.dpSize, 0, '--prefill').url, integer(flag, raw, 1, 65535));
    },
  },
  '--pd': { switch: (s, on) => (s.pd = on) },
  '--mock-decode-ms': { value: (s, raw, flag) => (s.settings.mockDecodeMs = integer(flag, raw, 0, 10_000)) },
  '--mock-port': { value: (s, raw, flag) => (s.settings.mockPort = integer(flag, raw, 0, 65535)) },
  '--mock-max-num-seqs': { value: (s, raw, flag) => (s.settings.mockMaxNumSeqs = integer(flag, raw, 1, 1_000_000)) },
  '--mock-speeds': { value: (s, raw, flag) => (s.settings.mockTiming.speeds = usage(() => parseSpeeds(flag, raw))) },
  '--mock-step-ms': { value: (s, raw, flag) => (s.settings.mockTiming.stepMs = integer(flag, raw, 1, 10_000)) },
  '--mock-cpu-blocks': { value: (s, raw, flag) => (s.settings.mockTiming.cpuBlocks = integer(flag, raw, 1, 100_000_000)) },
  '--max-inflight-per-rank': { value: (s, raw, flag) => (s.settings.admission.maxInflightPerRank = integer(flag, raw, 1, 1_000_000)) },
  '--queue-max': { value: (s, raw, flag) => (s.settings.admission.queueMax = integer(flag, raw, 0, 1_000_000)) },
  '--queue-timeout-ms': { value: (s, raw, flag) => (s.settings.admission.queueTimeoutMs = integer(flag, raw, 1, 3_600_000)) },
  '--tenant-header': { value: (s, raw, flag) => (s.settings.admission.tenantHeader = headerName(flag, raw)) },
  '--trust-tenant': { switch: (s, on) => (s.settings.admission.trustTenant = on) },
  '--tokens-per-minute': { value: (s, raw, flag) => (s.settings.admission.tokensPerMinute = integer(flag, raw, 1, Number.MAX_SAFE_INTEGER)) },
  '--redis': { value: (s, raw, flag) => (s.settings.admission.redisUrl = redisUrl(flag, raw)) },
  '--drain-timeout-ms': { value: (s, raw, flag) => (s.settings.drainTimeoutMs = integer(flag, raw, 0, 3_600_000)) },
  '--log-level': { value: (s, raw, flag) => (s.settings.logLevel = choice(flag, raw, LOG_LEVELS)) },
  '--otlp-endpoint': { value: (s, raw, flag) => (s.settings.otlpEndpoint = httpUrl(flag, raw)) },
  '--help': { switch: (s, on) => (s.help = on) },
  '-h': { switch: (s, on) => (s.help = on) },
};

/** vLLM's own names for the gateway's flags (`vllm serve --data-parallel-size 8` reads the same). */
const ALIASES: Readonly<Record<string, string>> = {
  '--data-parallel-size': '--dp-size',
  '--data-parallel-start-rank': '--start-rank',
};

/** vLLM flags that say how a server runs, which the gateway learns otherwise: what to give instead. */
const VLLM_ONLY: Readonly<Record<string, string>> = {
  '--data-parallel-size-local': 'give each server the global ranks it runs as --upstream URL@RANKS, e.g. http://node-b:8000@4-7',
  '--data-parallel-rank': 'an external-LB server of rank R is --upstream URL@R',
  '--data-parallel-hybrid-lb': 'give each node its ranks as --upstream URL@RANKS',
  '--data-parallel-external-lb': 'give each server its rank as --upstream URL@R',
};

/** Reads the command line; `'help'` when help was asked for. Throws `UsageError`. */
export function parseCommandLine(argv: readonly string[], env: NodeJS.ProcessEnv = {}): GatewaySettings | 'help' {
  const state: ParseState = {
    settings: {
      port: env.PORT === undefined || env.PORT === '' ? 30000 : integer('PORT', env.PORT, 0, 65535),
      // An empty HOST is unset: listen('') would bind every interface.
      host: env.HOST || '127.0.0.1',
      upstreams: [],
      dpSize: 4,
      policy: 'least-outstanding',
      trustHints: false,
      onInvalid: 'reassign',
      exposeDecision: false,
      mockDecodeMs: 0,
      mockPort: undefined,
      drainTimeoutMs: 30_000,
      healthCheckMs: 0,
      loadFeedbackMs: 0,
      loadFeedbackWeight: 0.5,
      logLevel: env.LOG_LEVEL === undefined || env.LOG_LEVEL === '' ? 'info' : choice('LOG_LEVEL', env.LOG_LEVEL, LOG_LEVELS),
      otlpEndpoint: undefined,
      tokenizer: undefined,
      chatTemplateKwargs: undefined,
      disaggregation: undefined,
      admission: {},
      mockMaxNumSeqs: 0,
      mockTiming: {},
      placementSlack: undefined,
      peers: undefined,
    },
    peerListen: undefined,
    peerAddresses: [],
    peerDns: undefined,
    peerRedis: false,
    kvEvents: new Map(),
    discover: false,
    upstreamSpecs: [],
    dnsSpecs: [],
    dnsServers: [],
    models: new Map(),
    lastUpstream: undefined,
    startRank: undefined,
    rankHeader: 'local',
    help: false,
    prefillSpecs: [],
    decodeSpecs: [],
    bootstrapPorts: new Map(),
    pd: false,
    connector: undefined,
  };

  /** Every flag given, and each single-value flag's value (a second one is refused). */
  const given = new Map<string, string | undefined>();
  for (let index = 0; index < argv.length; index++) {
    const arg = argv[index];
    const [typed, inline] = arg.startsWith('--') && arg.includes('=') ? splitOnce(arg) : [arg, undefined];
    const flag = Object.hasOwn(ALIASES, typed) ? ALIASES[typed] : typed;
    const spec = Object.hasOwn(FLAGS, flag) ? FLAGS[flag] : undefined;
    if (spec === undefined) throw new UsageError(notAnOption(arg, argv[index - 1]));
    if (!REPEATABLE.has(flag) && 'value' in spec && given.has(flag)) {
      throw new UsageError(repeated(flag, given.get(flag)!, inline ?? argv[index + 1] ?? ''));
    }
    given.set(flag, inline ?? argv[index + 1]);
    if ('switch' in spec) {
      if (inline !== undefined && inline !== 'true' && inline !== 'false') {
        throw new UsageError(`${flag} is a switch: give it alone, or as ${flag}=true or ${flag}=false, got ${JSON.stringify(arg)}`);
      }
      spec.switch(state, inline !== 'false');
      if (state.help) return 'help';
      continue;
    }
    let raw = inline;
    if (raw === undefined) {
      const next = argv[index + 1];
      raw = next === undefined || next.startsWith('--') ? undefined : argv[++index];
    }
    if (raw === undefined || raw === '') throw new UsageError(`${typed} needs a value (see --help)`);
    spec.value(state, raw, typed);
  }
  const { settings, kvEvents } = state;
  const withModels = <T extends object>(upstream: T, key: string): T => {
    const models = state.models.get(key);
    return { ...upstream, ...(state.discover && { discover: true }), ...(models && { models }) };
  };
  settings.upstreams = mergeUpstreams(state.upstreamSpecs, settings.dpSize, state.startRank, state.rankHeader).map((upstream) => {
    const events = kvEvents.get(upstream.url);
    return { ...withModels(upstream, upstream.url), ...(events && { kvEvents: events }) };
  });
  const dnsEntries = mergeDnsSpecs(state.dnsSpecs, settings.dpSize, state.startRank, state.rankHeader);
  for (const [key, { name, port, ranks, listed }] of dnsEntries) {
    const start = state.startRank ?? ranks[0];
    const dns = { name, port, ...(state.dnsServers.length > 0 && { servers: state.dnsServers }) };
    // Each address is an upstream named NAME/ADDRESS (NAME:PORT/ADDRESS for a name given with
    // two ports), so that two entries resolving to one address stay two upstreams.
    const label = [...dnsEntries.values()].some((other) => other.name === name && other.port !== port) ? `${name}:${port}` : name;
    const entry = { dns, name: label, startRank: start, dataParallelSize: ranks[ranks.length - 1] - start + 1, ...(listed && { ranks }), rankHeader: state.rankHeader };
    settings.upstreams.push(withModels(entry, key));
  }
  if (state.dnsServers.length > 0 && state.dnsSpecs.length === 0) throw new UsageError('--dns-server is the server --upstream-dns asks: give an --upstream-dns too');
  disaggregate(state);
  if (settings.admission.trustTenant !== undefined && settings.admission.tenantHeader === undefined) {
    throw new UsageError('--trust-tenant says whose --tenant-header is honoured: give --tenant-header NAME too');
  }
  refuseWithoutEffect(state, given);
  if (kvEvents.size > 0 && settings.tokenizer === undefined) {
    throw new UsageError('--kv-events needs --tokenizer PATH: the router tokenizes prompts with the model\'s own tokenizer to look them up');
  }
  // A password in the environment, not on a command line every user of the machine can read:
  // for whatever uses Redis (the token budget, the peers), never to turn either on.
  const redisFromEnv = env.DP_ROUTER_REDIS_URL;
  const needsRedis = settings.admission.tokensPerMinute !== undefined || state.peerRedis;
  if (needsRedis && settings.admission.redisUrl === undefined && redisFromEnv !== undefined && redisFromEnv !== '') {
    settings.admission.redisUrl = redisUrl('DP_ROUTER_REDIS_URL', redisFromEnv);
  }
  settings.peers = peersOf(state, env);
  return settings;
}

/**
 * A flag that the rest of the command line leaves without effect is refused, with the reason: a
 * flag accepted and then ignored would mislead whoever reads the command line.
 */
function refuseWithoutEffect(state: ParseState, given: ReadonlyMap<string, unknown>): void {
  const { settings } = state;
  // Only prefix-aware reads a tokenizer and a placement slack (with --pd or --prefill/--decode,
  // the prefill policy is prefix-aware).
  if (settings.policy !== 'prefix-aware' && settings.disaggregation === undefined) {
    for (const flag of ['--tokenizer', '--placement-slack', '--default-chat-template-kwargs']) {
      if (given.has(flag)) throw new UsageError(`${flag} is read only by --policy prefix-aware (or --pd, --prefill and --decode), and the policy is ${settings.policy}: add --policy prefix-aware or drop ${flag}`);
    }
  }
  const sloFlag = ['--slo-ttft-ms', '--slo-tpot-ms', '--trust-slo', '--slo-shed'].find((flag) => given.has(flag));
  if (sloFlag !== undefined && settings.policy !== 'prefix-aware') {
    throw new UsageError(`${sloFlag} routes on prefix-aware's cache and queue estimates, and the policy is ${settings.policy}: add --policy prefix-aware or drop ${sloFlag}`);
  }
  if (given.has('--load-feedback-weight') && settings.loadFeedbackMs === 0) {
    throw new UsageError('--load-feedback-weight weighs the engine load --load-feedback-ms polls, and that is off: add --load-feedback-ms N or drop --load-feedback-weight');
  }
  if (given.has('--on-invalid') && !settings.trustHints) {
    throw new UsageError('--on-invalid says what an invalid trusted hint gets, and hints are untrusted (each is removed unread): add --trust-hints or drop --on-invalid');
  }
  const upstreamFlag = ['--upstream', '--upstream-dns', '--prefill', '--decode'].find((flag) => given.has(flag));
  const mockFlag = ['--mock-port', '--mock-decode-ms', '--mock-max-num-seqs', '--mock-speeds', '--mock-step-ms', '--mock-cpu-blocks'].find((flag) => given.has(flag));
  if (upstreamFlag !== undefined && mockFlag !== undefined) {
    throw new UsageError(`${mockFlag} sets up the embedded mock vLLM, which does not start with ${upstreamFlag}: drop ${mockFlag}`);
  }
  const { speeds } = settings.mockTiming;
  if (given.has('--mock-decode-ms') && (given.has('--mock-speeds') || given.has('--mock-step-ms'))) {
    throw new UsageError('--mock-decode-ms times each request alone; --mock-speeds and --mock-step-ms time the engine in steps: give one or the other');
  }
  if (speeds !== undefined && speeds.length !== 1 && speeds.length !== settings.dpSize) {
    throw new UsageError(`--mock-speeds gives ${speeds.length} speeds for the embedded mock's ${settings.dpSize} ranks (--dp-size): give one per rank, or one for all`);
  }
  const everyUrlRanked = [...state.upstreamSpecs, ...state.prefillSpecs, ...state.decodeSpecs].every((spec) => parseUpstreamSpec(spec, 1).explicit);
  const everyNameRanked = state.dnsSpecs.every((spec) => parseDnsSpec(spec, 1, undefined).explicit);
  if (given.has('--dp-size') && upstreamFlag !== undefined && everyUrlRanked && everyNameRanked) {
    throw new UsageError('--dp-size gives the ranks of each upstream given without @RANKS (and of the embedded mock), and every upstream here gives its own: drop --dp-size');
  }
}

/** The answer to an argument that is no flag: a value after a switch, a stray word, an unknown option. */
function notAnOption(arg: string, previous: string | undefined): string {
  const name = arg.split('=')[0];
  if (Object.hasOwn(VLLM_ONLY, name)) return `${name} is a vllm serve flag the gateway does not take: ${VLLM_ONLY[name]} (see --help)`;
  if (arg.startsWith('-')) return `unknown option ${JSON.stringify(arg)} (see --help)`;
  const previousFlag = previous !== undefined && Object.hasOwn(FLAGS, previous) ? FLAGS[previous] : undefined;
  if (previousFlag !== undefined && 'switch' in previousFlag) {
    return `${previous} is a switch and takes no value, got ${JSON.stringify(arg)} after it: give ${previous} alone to turn it on, or ${previous}=false`;
  }
  return `unexpected argument ${JSON.stringify(arg)}: every option starts with -- (see --help)`;
}

/** Flags given once per upstream or per item; any other flag with a value is given at most once. */
const REPEATABLE: ReadonlySet<string> = new Set(['--upstream', '--upstream-dns', '--dns-server', '--model', '--kv-events', '--peer', '--prefill', '--decode', '--bootstrap-port']);
/**
 * Flags that apply to every upstream, though they may be written after one as `--model` is, and
 * what to give instead of a second value.
 */
const EVERY_UPSTREAM: Readonly<Record<string, string>> = {
  '--dp-size': '; give a server of another size its ranks as URL@RANKS, e.g. http://10.0.0.6:8000@0-3',
  '--start-rank': '; without --start-rank, each server\'s first engine is read from its /metrics at start',
  '--rank-header': '',
};

/** A single-value flag given again, both values shown without user information. */
function repeated(flag: string, first: string, second: string): string {
  const shown = `(${JSON.stringify(redactUrl(first))}, then ${JSON.stringify(redactUrl(second))})`;
  if (Object.hasOwn(EVERY_UPSTREAM, flag)) return `${flag} is given twice ${shown}: one value applies to every upstream, not to the one before it${EVERY_UPSTREAM[flag]}`;
  return `${flag} is given twice ${shown}: it takes one value; give it once`;
}

/**
 * `--peer-listen` and `--peer`, with the secret from the environment (a command line is visible
 * to every user of the machine); the router checks the addresses and the secret's length.
 */
function peersOf(state: ParseState, env: NodeJS.ProcessEnv): GatewaySettings['peers'] {
  const { peerListen: listen, peerAddresses: addresses, peerDns: dns } = state;
  if (state.peerRedis) {
    if (listen !== undefined || addresses.length > 0 || dns !== undefined) throw new UsageError('--peer-redis announces through Redis instead of UDP: drop --peer-listen, --peer and --peer-dns');
    if (state.settings.admission.redisUrl === undefined) throw new UsageError('--peer-redis announces on a Redis server: give its URL in DP_ROUTER_REDIS_URL (or --redis URL)');
    return { addresses: [], redis: true, secret: peerSecret(env, '--peer-redis') };
  }
  if (listen === undefined) {
    if (addresses.length > 0 || dns !== undefined) throw new UsageError('--peer and --peer-dns name the other replicas for --peer-listen: give --peer-listen HOST:PORT too');
    return undefined;
  }
  if (addresses.length === 0 && dns === undefined) {
    throw new UsageError('--peer-listen needs the replicas to announce to: give --peer HOST:PORT for each (the same list on every replica), or --peer-dns NAME:PORT');
  }
  return { listen, addresses, ...(dns && { dns }), secret: peerSecret(env, '--peer-listen') };
}

/** The replicas' shared secret, from the environment (a command line is visible to every user of the machine). */
function peerSecret(env: NodeJS.ProcessEnv, flag: string): string {
  const secret = env.DP_ROUTER_PEER_SECRET;
  if (secret === undefined || secret === '') throw new UsageError(`${flag} needs the replicas' shared secret in DP_ROUTER_PEER_SECRET (e.g. \`openssl rand -hex 32\`)`);
  return secret;
}

/** `--prefill`/`--decode` add upstreams of those roles; `--pd` asks for the embedded pair. */
function disaggregate(state: ParseState): void {
  const { settings, prefillSpecs, decodeSpecs } = state;
  const split = prefillSpecs.length > 0 || decodeSpecs.length > 0;
  if (state.pd && (split || settings.upstreams.length > 0)) throw new UsageError('--pd runs the embedded mocks; give --prefill and --decode for real servers instead');
  if (split && (prefillSpecs.length === 0 || decodeSpecs.length === 0)) throw new UsageError('--prefill and --decode go together: give at least one of each');
  if (state.bootstrapPorts.size > 0 && state.connector !== 'mooncake') throw new UsageError('--bootstrap-port is for --pd-connector mooncake');
  if (!split && !state.pd) {
    if (state.connector !== undefined) throw new UsageError('--pd-connector needs --pd, or --prefill and --decode');
    return;
  }
  settings.disaggregation = { connector: state.connector ?? 'nixl' };
  const merge = (specs: string[], role: 'prefill' | 'decode') =>
    mergeUpstreams(specs, settings.dpSize, state.startRank, state.rankHeader, `--${role}`).map((upstream) => {
      const bootstrapPort = role === 'prefill' ? state.bootstrapPorts.get(upstream.url) : undefined;
      return { ...upstream, role, ...(bootstrapPort !== undefined && { bootstrapPort }) };
    });
  settings.upstreams = [...settings.upstreams, ...merge(prefillSpecs, 'prefill'), ...merge(decodeSpecs, 'decode')];
}

/**
 * Turns `URL[@RANKS]` specs into upstreams, one per URL. vllm-router names one rank per
 * `URL@RANK` and repeats the URL; here repeats add ranks to the same upstream.
 */
function mergeUpstreams(specs: readonly string[], dpSize: number, startRank: number | undefined, rankHeader: RankHeaderMode, flag = '--upstream'): Array<UpstreamOptions & Pick<GatewayUpstream, 'learnStartRank'>> {
  const byUrl = new Map<string, Set<number>>();
  // URLs given with @RANKS: only those limit what --discover may route to (`ranks`).
  const listed = new Set<string>();
  for (const spec of specs) {
    const { url, ranks, explicit } = parseUpstreamSpec(spec, dpSize, startRank, flag);
    const known = byUrl.get(url) ?? new Set<number>();
    ranks.forEach((rank) => known.add(rank));
    byUrl.set(url, known);
    if (explicit) listed.add(url);
  }
  return [...byUrl].map(([url, rankSet]) => {
    const ranks = [...rankSet].sort((a, b) => a - b);
    // A list from 0 is a server whose first engine is 0. Any other list is either some ranks of
    // an internal-LB server (first engine 0) or a hybrid node's (first engine its start rank):
    // the list cannot tell, the server's /metrics can (start-rank.ts), unless --start-rank says.
    const start = startRank ?? ranks[0];
    if (start > ranks[0]) throw new UsageError(`${flag} ${redactUrl(url)} routes rank ${ranks[0]}, below --start-rank ${start}`);
    const learn = startRank === undefined && ranks[0] > 0 && rankHeader === 'local';
    return { url, startRank: start, dataParallelSize: ranks[ranks.length - 1] - start + 1, ...(listed.has(url) && { ranks }), rankHeader, ...(learn && { learnStartRank: flag }) };
  });
}

/**
 * Why a rank list not starting at 0 needs `--start-rank` when the servers' `/metrics` cannot say
 * (vLLM reads the header as an index into the engines the server manages; see start-rank.ts).
 */
export const START_RANK_UNKNOWN =
  'the rank header is an index from 0 into the engines that server runs, and its first engine is not known: give --start-rank N (its --data-parallel-start-rank: 0 for `vllm serve --data-parallel-size N`, the node\'s start rank for a hybrid node)';

/** `--upstream-dns` entries by `dns:NAME:PORT` (the key `--model` uses): one given again adds ranks, as a repeated `--upstream` does. */
function mergeDnsSpecs(specs: readonly string[], dpSize: number, startRank: number | undefined, rankHeader: RankHeaderMode): Map<string, { name: string; port: number; ranks: number[]; listed: boolean }> {
  const entries = new Map<string, { name: string; port: number; ranks: number[]; listed: boolean }>();
  for (const spec of specs) {
    const { name, port, ranks, explicit } = parseDnsSpec(spec, dpSize, startRank, rankHeader);
    const key = `dns:${name}:${port}`;
    const known = entries.get(key);
    // Given with @RANKS: only those may --discover route to (`ranks`).
    entries.set(key, { name, port, ranks: [...new Set([...(known?.ranks ?? []), ...ranks])].sort((a, b) => a - b), listed: explicit || known?.listed === true });
  }
  return entries;
}

/** `NAME:PORT[@RANKS]` of `--upstream-dns`. */
function parseDnsSpec(spec: string, dpSize: number, startRank: number | undefined, rankHeader?: RankHeaderMode): { name: string; port: number; ranks: number[]; explicit: boolean } {
  const found = /^([A-Za-z0-9_][A-Za-z0-9_.-]*):(\d{1,5})(?:@(.+))?$/.exec(spec);
  if (!found || Number(found[2]) < 1 || Number(found[2]) > 65535) {
    throw new UsageError(`--upstream-dns ${JSON.stringify(spec)} is not NAME:PORT[@RANKS], e.g. vllm.default.svc.cluster.local:8000`);
  }
  const start = startRank ?? 0;
  const ranks = found[3] === undefined ? Array.from({ length: dpSize }, (_, offset) => start + offset) : [...new Set(parseRankList(`--upstream-dns ${JSON.stringify(spec)}`, found[3]))].sort((a, b) => a - b);
  if (startRank !== undefined && startRank > ranks[0]) throw new UsageError(`--upstream-dns ${spec} routes rank ${ranks[0]}, below --start-rank ${startRank}`);
  // The addresses are not known yet, so no /metrics can say where their engines start.
  if (startRank === undefined && ranks[0] > 0 && rankHeader === 'local') {
    throw new UsageError(`--upstream-dns ${spec}: ${START_RANK_UNKNOWN}`);
  }
  return { name: found[1], port: Number(found[2]), ranks, explicit: found[3] !== undefined };
}

/** A DNS server address as node:dns takes it: an IP address with an optional port. */
function dnsServer(flag: string, raw: string): string {
  try {
    new Resolver().setServers([raw]);
  } catch {
    throw new UsageError(`${flag} must be an IP address with an optional port, e.g. 10.96.0.10 or 127.0.0.1:5353, got ${JSON.stringify(raw)}`);
  }
  return raw;
}

/**
 * What may follow a URL's user information: a host (a name or address, or `[IPv6]`), then an
 * optional port and path. Anything else after the last `@` is a rank list, well formed or not.
 */
const HOST_AFTER_AT = /^(?:\[[0-9A-Za-z:.%]+\]|[A-Za-z0-9._-]*[A-Za-z._-][A-Za-z0-9._-]*)(?::\d*)?(?:[/?#].*)?$/;

function parseUpstreamSpec(spec: string, dpSize: number, startRank = 0, flag = '--upstream'): { url: string; ranks: number[]; explicit: boolean } {
  const at = spec.lastIndexOf('@');
  // A typo in the ranks (`URL@0,2,x`) is a bad rank list, not credentials with a host `0,2,x`.
  const tail = spec.slice(at + 1);
  const hasRanks = at > spec.indexOf('//') + 1 && (/^[0-9,\- ]+$/.test(tail) || !HOST_AFTER_AT.test(tail));
  const url = hasRanks ? spec.slice(0, at) : spec;
  const ranksText = hasRanks ? spec.slice(at) : '';
  // Never print a password: every message below names the spec without user information.
  const shownSpec = JSON.stringify(redactUrl(url) + ranksText);
  let parsed: URL;
  try {
    parsed = new URL(url);
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new Error();
  } catch {
    throw new UsageError(`${flag} ${shownSpec} is not an http(s) URL[@RANKS]`);
  }
  const problem = upstreamUrlProblem(parsed);
  if (problem) {
    const apiKey = problem.credentials ? ` (${AUTHORIZATION})` : '';
    throw new UsageError(`${flag} ${shownSpec} ${problem.problem}: give ${flag} ${problem.url}${ranksText} instead${apiKey}`);
  }
  if (!hasRanks) return { url, ranks: Array.from({ length: dpSize }, (_, offset) => startRank + offset), explicit: false };
  return { url, ranks: parseRankList(`${flag} ${shownSpec}`, spec.slice(at + 1)), explicit: true };
}

/** `0,2,4,6`, `4-7` or a mix such as `0-1,6`; `where` names the flag and spec in messages. */
function parseRankList(where: string, list: string): number[] {
  const ranks: number[] = [];
  for (const part of list.split(',')) {
    const range = /^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$/.exec(part);
    if (!range) throw new UsageError(`${where}: ${JSON.stringify(part)} is not a rank: ranks after the @ look like 0,2,4,6 or 4-7`);
    const first = Number(range[1]);
    const last = range[2] === undefined ? first : Number(range[2]);
    if (last < first || last - first > 65536) throw new UsageError(`${where}: range ${part.trim()} runs backwards or is too long`);
    for (let rank = first; rank <= last; rank++) ranks.push(rank);
  }
  return ranks;
}

/** A path flag's value, refused when nothing is there: a typo fails at once, not at the first request. */
function existingPath(flag: string, raw: string): string {
  if (!existsSync(raw)) throw new UsageError(`${flag} ${JSON.stringify(raw)}: no such file or directory`);
  return raw;
}

/** A JSON object, as vLLM's `--default-chat-template-kwargs` takes (`json.loads`); the router checks its keys. */
function jsonObject(flag: string, raw: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (error) {
    throw new UsageError(`${flag} must be JSON, e.g. '{"enable_thinking": false}': ${(error as Error).message}`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new UsageError(`${flag} must be a JSON object, e.g. '{"enable_thinking": false}', got ${JSON.stringify(raw)}`);
  return value as Record<string, unknown>;
}

/** `ENDPOINT[,REPLAY_ENDPOINT]`, each a ZeroMQ endpoint the router connects to. */
function kvEventsSpec(flag: string, raw: string): KvEventsOptions {
  const [endpoint, replayEndpoint, extra] = raw.split(',');
  try {
    if (extra !== undefined) throw new TypeError('give at most two endpoints');
    resolveKvEndpoints(endpoint, [0], flag);
    if (replayEndpoint !== undefined) resolveKvEndpoints(replayEndpoint, [0], flag);
  } catch (error) {
    throw new UsageError(`${flag} ${JSON.stringify(raw)}: ${(error as Error).message.replace(`${flag}: `, '').replace(`${flag} `, '')}`);
  }
  return replayEndpoint === undefined ? { endpoint } : { endpoint, replayEndpoint };
}

function httpUrl(flag: string, raw: string): string {
  try {
    const url = new URL(raw);
    if (url.protocol === 'http:' || url.protocol === 'https:') return url.href;
  } catch {
    // answered below
  }
  throw new UsageError(`${flag} must be an http(s) URL such as http://127.0.0.1:4318, got ${JSON.stringify(redactUrl(raw))}`);
}

function splitOnce(arg: string): [string, string] {
  const at = arg.indexOf('=');
  return [arg.slice(0, at), arg.slice(at + 1)];
}

function integer(flag: string, raw: string, min: number, max: number): number {
  if (!/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
    throw new UsageError(`${flag} must be an integer from ${min} to ${max}, got ${JSON.stringify(raw)}`);
  }
  return Number(raw);
}

/** A plain decimal from `min` to `max` (`0.5`, `4`): no exponent, sign or hex, which `Number()` would take. */
function decimal(flag: string, raw: string, min: number, max: number): number {
  if (!/^\d+(?:\.\d+)?$/.test(raw) || Number(raw) < min || Number(raw) > max) {
    throw new UsageError(`${flag} must be a number from ${min} to ${max}, got ${JSON.stringify(raw)}`);
  }
  return Number(raw);
}

function fraction(flag: string, raw: string): number {
  if (!/^(?:0|1|0?\.\d+|1\.0*)$/.test(raw)) throw new UsageError(`${flag} must be a number from 0 to 1, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

function choice<T extends string>(flag: string, raw: string, allowed: readonly T[]): T {
  if (!allowed.includes(raw as T)) throw new UsageError(`${flag} must be one of ${allowed.join(', ')}, got ${JSON.stringify(raw)}`);
  return raw as T;
}

/** A header name, as RFC 9110 allows. */
function headerName(flag: string, raw: string): string {
  if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(raw)) throw new UsageError(`${flag} must be a header name, e.g. x-tenant-id, got ${JSON.stringify(raw)}`);
  return raw.toLowerCase();
}

/** A redis:// or rediss:// URL. */
function redisUrl(flag: string, raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new UsageError(`${flag} must be a redis:// URL, e.g. redis://127.0.0.1:6379, got ${JSON.stringify(redactUrl(raw))}`);
  }
  if (url.protocol !== 'redis:' && url.protocol !== 'rediss:') throw new UsageError(`${flag} must be a redis:// or rediss:// URL, got ${JSON.stringify(redactUrl(raw))}`);
  return raw;
}

/** Runs a parser of the mock's command, whose errors are plain `Error`s, as a gateway flag's. */
function usage<T>(parse: () => T): T {
  try {
    return parse();
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}
