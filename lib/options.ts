import { parseMaxBodyBytes, parseMaxBufferedBytes, type BodyLimitOptions } from './http/body-budget';
import { parseLoadFeedback, type LoadFeedbackConfig, type LoadFeedbackOptions } from './upstreams/engine-watch-options';
import { parseHealthCheck, type HealthCheckConfig, type HealthCheckOptions } from './upstreams/health-checker-options';
import { parseHints, RANK_HEADER, type HintConfig, type HintOptions } from './request/hint-options';
import { parseLogger, type Logger, type RouterLogger } from './observe/logger';
import { parseMetrics, type MetricsConfig, type MetricsOptions } from './observe/metrics';
import { booleanOption, fail, headerNameOption, isPlainObject, rejectProxyOnly, rejectUnknownKeys, shown, type KeysEnum } from './option-checks';
import { parseOutlierDetection, type OutlierDetectionConfig, type OutlierDetectionOptions } from './upstreams/outlier-detector-options';
import { parsePolicy } from './policies/by-name';
import type { PrefixAwareRouterSettings } from './policies/prefix-aware-options';
import { parseRouterPrefixAware, requireTokenizerForKvEvents, type PrefixAwareRouterConfig } from './exact-prefix/options';
import { parseAdmission, type AdmissionOptions, type AdmissionSettings } from './admission/options';
import { parseAffinity, type AffinityConfig, type AffinityOptions } from './policies/session-affinity-options';
import { parseRetries, type RetryConfig, type RetryOptions } from './forward/retry-options';
import { parseRequestBuffering, type BufferingConfig, type RequestBufferingOptions } from './request/buffering-options';
import { parseTimeouts, type BodyTimeoutOptions, type TimeoutConfig, type TimeoutOptions } from './http/timeout-options';
import type { Policy, PolicyName } from './types';
import { parseUpstreams, type UpstreamConfig, type UpstreamEntry } from './upstreams/upstream-options';
import { parseDisaggregation, type DisaggregationConfig, type DisaggregationOptions } from './disaggregation/options';
import { parsePeers, type PeersConfig, type PeersOptions } from './peers/peer-options';
import { parseReceipts, type ReceiptsConfig, type ReceiptsOptions } from './receipts/options';
import { parseSlo, type SloConfig, type SloOptions } from './slo/options';
import { parseVerdicts, type VerdictsConfig, type VerdictsOptions } from './verdicts/options';

export type { HealthCheckConfig, LoadFeedbackConfig, OutlierDetectionConfig, UpstreamConfig };

/** Options of {@link dpRank}: hint handling and rank assignment, without the proxy. */
export interface DpRankOptions extends BodyLimitOptions {
  /** The vLLM servers (by `url`, or every address of a `dns` name) and the ranks each serves. Required, at least one. */
  upstreams: readonly UpstreamEntry[];
  /** How a rank is assigned when no valid trusted hint was given. Default: `'least-outstanding'`. */
  policy?: PolicyName | Policy;
  /** Client hint handling. Default: hints untrusted. */
  hints?: HintOptions;
  /** The rank header set on the request. Default: `'X-data-parallel-rank'`. */
  header?: string;
  /** Metrics settings, or `false` for none. Default: on, with the defaults of {@link MetricsOptions}. */
  metrics?: MetricsOptions | false;
  /** Session keys and bounds of the `session-affinity` policy (checked whatever the policy). */
  affinity?: AffinityOptions;
  /** Settings of the `'prefix-aware'` policy and its tokenizer for exact prefix routing (checked whatever the policy). */
  prefixAware?: PrefixAwareRouterSettings;
  /** The request body timeout. */
  timeouts?: BodyTimeoutOptions;
  /** Answer with `X-DP-Router-Decision` (reveals server layout). Default: `false`. */
  exposeDecision?: boolean;
  /** Blend engine-reported load into the load policies see, or `false`. Default: `false` (off). */
  loadFeedback?: LoadFeedbackOptions | boolean;
  /**
   * Where the router logs: a pino logger as it is, `console`, or anything with `warn`.
   * Run-time notices (a body parser mounted before it, ranks discovered) go to `warn`, each
   * kind once per occurrence; an ejected endpoint to `info`; one structured line per routing
   * decision and per retry to `debug`, only when `isLevelEnabled('debug')` says so (pino's
   * level check, so `console` never gets them). `false` silences it.
   * Default: notices as `process.emitWarning`, nothing else.
   */
  logger?: Logger | false;
}

/** The options only the proxy uses: `dpRank()` refuses them, naming `dpRouter()`. */
interface ProxyOptions {
  /**
   * Tell the upstream who the client is, in `X-Forwarded-For`, `-Host`, `-Port` and `-Proto`.
   * `true`: the gateway's own view (the peer's address, the `Host` header, the local port and
   * protocol), replacing whatever the client sent in those headers and in `Forwarded`, which
   * anyone could forge. `'append'`: behind a proxy you trust, which sets them itself: the
   * peer's address, port and protocol are appended to the values it sent and its
   * `X-Forwarded-Host` kept (http-proxy-middleware's `xfwd`). Like Express's `trust proxy`,
   * incoming values are trusted only when you say so. Default: `false` (headers left as they
   * came). The router sets them once per request, on both legs of a disaggregated one, not
   * http-proxy on each try.
   */
  xfwd?: boolean | 'append';
  /** Passive ejection of failing endpoints, or `false`. Default: on, with the defaults of {@link OutlierDetectionOptions}. */
  outlierDetection?: OutlierDetectionOptions | boolean;
  /** Active health checks of each upstream, `true` for the defaults. Default: `false` (off). */
  healthCheck?: HealthCheckOptions | boolean;
  /** Retries of failed connections on another endpoint, or `false`. Default: on, with the defaults of {@link RetryOptions}. */
  retries?: RetryOptions | boolean;
  /**
   * Split each request into a prefill leg and a decode leg, on the upstreams of those `role`s
   * (docs/disaggregation.md). Default: off (every request goes whole to one endpoint).
   */
  disaggregation?: DisaggregationOptions;
  /** Capacity per endpoint, a fair queue across tenants, priorities and token budgets (docs/operating.md). Default: off. */
  admission?: AdmissionOptions;
  /**
   * Read a request body whole before opening the upstream connection (nginx's
   * `proxy_request_buffering on`), so that slow clients hold the gateway's sockets, not the
   * engine's; `false` streams every body routing does not read. Default: on, up to
   * {@link RequestBufferingOptions.maxBytes} (1 MiB).
   */
  requestBuffering?: RequestBufferingOptions | boolean;
  /**
   * Gateway replicas that announce their in-flight requests and pending prefill per endpoint to
   * each other over UDP, so that each prices the queue every replica put on an engine
   * (docs/routing-quality.md). Default: off.
   */
  peers?: PeersOptions | false;
  /**
   * Route receipts: each routed request checked against what the engine reports after it (its
   * KV events, its answer's usage), so that a rank header the server does not honour, or an exact
   * index that no longer matches its cache, is counted, logged and routed around
   * (docs/route-receipts.md). `false` turns them off. Default: on, with the defaults of
   * {@link ReceiptsOptions} (each part applies where the router has what it needs).
   */
  receipts?: ReceiptsOptions | boolean;
  /**
   * Latency objectives per request (defaults, and `x-slo-ttft-ms` / `x-slo-tpot-ms` from trusted
   * callers), met by routing on a latency model learned online; needs `policy: 'prefix-aware'`
   * (docs/slo-routing.md). Default: off.
   */
  slo?: SloOptions;
  /**
   * What it takes for evidence from client traffic to change how an upstream is served for
   * every client (a rank header taken as refused or not honoured, an exact index or tokenizer
   * not trusted, an endpoint ejected): docs/security.md. Default: `{ minSources: 3 }`.
   */
  verdicts?: VerdictsOptions;
}

/** Options of {@link dpRouter}: those of `dpRank()`, the upstream timeouts, and the proxy's own. */
export interface DpRouterOptions extends Omit<DpRankOptions, 'timeouts'>, ProxyOptions {
  /** Upstream and request body timeouts. */
  timeouts?: TimeoutOptions;
}

/** Options of {@link dpRouter} (`DpRouterOptions`); `dpRank()` takes {@link DpRankOptions}. */
export type Options = DpRouterOptions;

/** Which middleware the options are for. */
export type Mode = 'dpRank' | 'dpRouter';

/**
 * The options, validated and resolved once at creation into plain, frozen values shaped like
 * the options: one key per option, each holding that part's resolved settings, defaults
 * filled in. Nothing here holds a socket, a timer or a policy's state (RouterServices builds
 * those from it). The user's own objects (a Policy, a registry, a logger, a `trust` function)
 * are kept as given.
 */
export interface Configuration {
  /** Every entry as given, DNS entries as templates; the services start from those given by `url`. */
  readonly upstreams: readonly UpstreamConfig[];
  /** A built-in policy's name (built by the services), or the user's Policy object. */
  readonly policy: PolicyName | Policy;
  readonly hints: HintConfig;
  /** The outgoing rank header, lower-cased. */
  readonly header: string;
  /** `undefined` when off. */
  readonly metrics: MetricsConfig | undefined;
  /** Where the session key is found, and the `session-affinity` policy's bounds. */
  readonly affinity: AffinityConfig;
  /** The `prefix-aware` policy's settings and the tokenizer's files for exact prefix routing. */
  readonly prefixAware: PrefixAwareRouterConfig;
  /** For `dpRank()`, the body timeout alone is an option; the others keep their defaults. */
  readonly timeouts: TimeoutConfig;
  readonly maxBodyBytes: number;
  /** The bound of the router's one body budget, shared by all its requests. */
  readonly maxBufferedBytes: number;
  readonly exposeDecision: boolean;
  /** Engine load polling; `undefined` when off. */
  readonly loadFeedback: LoadFeedbackConfig | undefined;
  readonly logger: RouterLogger;
  /** `'replace'` for `xfwd: true`; `false` when off (always, for `dpRank()`). */
  readonly xfwd: false | 'replace' | 'append';
  /** Passive ejection settings; `undefined` when off (always, for `dpRank()`). */
  readonly outlierDetection: OutlierDetectionConfig | undefined;
  /** Active health check settings; `undefined` when off (always, for `dpRank()`). */
  readonly healthCheck: HealthCheckConfig | undefined;
  /** One attempt and no body held when off (always, for `dpRank()`). */
  readonly retries: RetryConfig;
  /** Prefill/decode disaggregation; `undefined` when off. */
  readonly disaggregation: DisaggregationConfig | undefined;
  /** Admission control; `undefined` when off (always, for `dpRank()`). */
  readonly admission: AdmissionSettings | undefined;
  /** `maxBytes` 0 when off (always, for `dpRank()`). */
  readonly requestBuffering: BufferingConfig;
  /** The peer link; `undefined` when off (always, for `dpRank()`). */
  readonly peers: PeersConfig | undefined;
  /** Route receipts; `undefined` when off (always, for `dpRank()`). */
  readonly receipts: ReceiptsConfig | undefined;
  /** SLO-aware routing; `undefined` when off (always, for `dpRank()`). */
  readonly slo: SloConfig | undefined;
  /** What takes a verdict that changes routing for everyone. */
  readonly verdicts: VerdictsConfig;
}

const EXPOSE_DECISION = false;

const RANK_KEYS: KeysEnum<DpRankOptions> = {
  upstreams: true,
  policy: true,
  hints: true,
  header: true,
  metrics: true,
  affinity: true,
  prefixAware: true,
  timeouts: true,
  maxBodyBytes: true,
  maxBufferedBytes: true,
  exposeDecision: true,
  loadFeedback: true,
  logger: true,
};
const PROXY_KEYS: KeysEnum<ProxyOptions> = { xfwd: true, outlierDetection: true, healthCheck: true, retries: true, disaggregation: true, admission: true, requestBuffering: true, peers: true, receipts: true, slo: true, verdicts: true };
const ROUTER_KEYS: KeysEnum<DpRouterOptions> = { ...RANK_KEYS, ...PROXY_KEYS };

/**
 * Validates `options` and resolves every default, each part by its own parser. Throws
 * {@link OptionError} (a `TypeError`) on the first wrong option; for `dpRank()`, an option of
 * the proxy is one.
 */
export function parseOptions(options: DpRankOptions | DpRouterOptions, mode: Mode = 'dpRouter'): Configuration {
  if (!isPlainObject(options)) {
    fail('options', `must be an object, got ${shown(options)}`, `Pass e.g. \`${mode}({ upstreams: [{ url: 'http://127.0.0.1:8000' }] })\`.`);
  }
  const proxying = mode === 'dpRouter';
  if (!proxying) rejectProxyOnly('', options, PROXY_KEYS);
  rejectUnknownKeys('', options, proxying ? ROUTER_KEYS : RANK_KEYS);
  const proxy: ProxyOptions = proxying ? (options as DpRouterOptions) : {};
  // In this order, so that the first wrong option is reported first.
  const upstreams = parseUpstreams('upstreams', options.upstreams);
  const hints = parseHints('hints', options.hints);
  const affinity = parseAffinity('affinity', options.affinity);
  const prefixAware = parseRouterPrefixAware('prefixAware', options.prefixAware);
  const policy = parsePolicy('policy', options.policy);
  requireTokenizerForKvEvents(upstreams, policy === 'prefix-aware', prefixAware.tokenizer);
  const disaggregation = parseDisaggregation('disaggregation', proxy.disaggregation, upstreams);
  const maxBufferedBytes = parseMaxBufferedBytes('maxBufferedBytes', options.maxBufferedBytes);
  const settings: Configuration = {
    upstreams,
    policy,
    hints,
    header: headerNameOption('header', options.header, RANK_HEADER),
    metrics: parseMetrics('metrics', options.metrics),
    affinity,
    prefixAware,
    timeouts: parseTimeouts('timeouts', options.timeouts, proxying),
    maxBodyBytes: parseMaxBodyBytes('maxBodyBytes', options.maxBodyBytes),
    maxBufferedBytes,
    exposeDecision: booleanOption('exposeDecision', options.exposeDecision, EXPOSE_DECISION),
    xfwd: parseXfwd('xfwd', proxy.xfwd),
    outlierDetection: proxying ? parseOutlierDetection('outlierDetection', proxy.outlierDetection) : undefined,
    healthCheck: parseHealthCheck('healthCheck', proxy.healthCheck),
    retries: parseRetries('retries', proxying ? proxy.retries : false),
    requestBuffering: parseRequestBuffering('requestBuffering', proxying ? proxy.requestBuffering : false, maxBufferedBytes),
    loadFeedback: parseLoadFeedback('loadFeedback', options.loadFeedback),
    logger: parseLogger('logger', options.logger),
    disaggregation,
    admission: parseAdmission('admission', proxy.admission, hints.trust),
    peers: parsePeers('peers', proxy.peers),
    receipts: proxying ? parseReceipts('receipts', proxy.receipts) : undefined,
    slo: proxying ? parseSlo('slo', proxy.slo, policy) : undefined,
    verdicts: parseVerdicts('verdicts', proxy.verdicts),
  };
  for (const part of OWN_PARTS) freezePart(settings[part]);
  for (const upstream of upstreams) Object.freeze(upstream);
  return Object.freeze(settings);
}

/** The parts parsing made (the user's objects inside them, a registry or a store, stay as given). */
const OWN_PARTS = ['upstreams', 'hints', 'metrics', 'affinity', 'prefixAware', 'timeouts', 'loadFeedback', 'outlierDetection', 'healthCheck', 'retries', 'requestBuffering', 'disaggregation', 'admission', 'peers', 'receipts', 'slo', 'verdicts'] as const satisfies ReadonlyArray<keyof Configuration>;

function freezePart(part: object | undefined): void {
  if (part !== undefined) Object.freeze(part);
}

function parseXfwd(path: string, value: unknown): Configuration['xfwd'] {
  if (value === undefined || value === false) return false;
  if (value === true) return 'replace';
  if (value === 'append') return 'append';
  return fail(path, `must be true or false, or 'append', got ${shown(value)}`, `Use \`${path}: true\` to set the gateway's own view, or \`${path}: 'append'\` behind a trusted proxy.`);
}
