import type { Registry } from 'prom-client';
import { createExactRouting, type ExactRouting } from '../exact-prefix/exact-routing';
import { loadTokenizer } from '../exact-prefix/load-tokenizer';
import type { PromptTokenizer } from '../exact-prefix/tokenizer/tokenizer';
import { exactTokenizer, requireTokenizerForKvEvents, unusedKvEventsNotice, type TokenizerSource } from '../exact-prefix/options';
import { createEvents, type RouterEvents } from '../observe/events';
import { createMetrics, NO_METRICS, type RouterMetrics } from '../observe/metrics';
import type { Tracing } from '../observe/tracing';
import type { Configuration } from '../options';
import { buildPolicy } from '../policies/by-name';
import { routePolicy, type RoutePolicy } from '../policies/route-policy';
import type { HintConfig } from '../request/hint-options';
import { createRequestInputs, type RequestInputs } from '../request/request-inputs';
import type { Policy, PolicyName } from '../types';
import { EndpointTable, type RouteEndpoint } from '../upstreams/endpoints';
import { startHealthChecks, type HealthChange, type HealthChecker } from '../upstreams/health-checker';
import { OutlierDetector } from '../upstreams/outlier-detector';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import type { ReceiptsConfig } from '../receipts/options';
import { Receipts } from '../receipts/receipts';
import { Verdicts } from '../verdicts/verdicts';

/** The options a pool of upstreams reads (the router's `Configuration` is one). */
export type PoolConfig = Pick<Configuration, 'policy' | 'prefixAware' | 'affinity' | 'hints' | 'header' | 'metrics' | 'healthCheck' | 'outlierDetection' | 'logger' | 'verdicts'>;

/** What one pool of upstreams is built from. */
export interface PoolParts {
  readonly config: PoolConfig;
  /** The pool's policy, built from `policy` (or `disaggregation.prefillPolicy` for the prefill pool) by {@link poolPolicy}. */
  readonly policy: RoutePolicy;
  /** The tokenizer its exact prefix routing loads, by {@link poolPolicy}; `undefined`: none. */
  readonly tokenizer: TokenizerSource | undefined;
  readonly upstreams: readonly UpstreamConfig[];
  /** The router's registry (a private one with `metrics: false`). */
  readonly registry: Registry;
  readonly tracing: Tracing;
  /** The rules its requests' hints are judged by. Default: `hints`. */
  readonly hints?: HintConfig;
  /** The upstreams whose scrape failures have a series (the engine watch's), among these. Default: none. */
  readonly scraped?: (upstreams: readonly UpstreamConfig[]) => string[];
  /** The endpoints whose health changes this pool tells (another pool may tell the rest). Default: all. */
  readonly tellsHealthOf?: (endpoint: RouteEndpoint) => boolean;
  /** Whether a model name is a LoRA adapter (the model pools'), for exact routing. Default: as KV events say. */
  readonly isAdapter?: (model: string) => boolean;
  /** Route receipts of this pool's requests (`receipts`, whole requests only). Default: none. */
  readonly receipts?: ReceiptsConfig;
  /** The router's verdict book, when another pool made it already. Default: one of its own. */
  readonly verdicts?: Verdicts;
}

const NOT_SCRAPED = (): string[] => [];

/** The router's tokenizer, loaded once whichever of its pools route on it (the decode pool and the prefill pool share it). */
const tokenizers = new WeakMap<PoolConfig, PromptTokenizer>();

function tokenizerOf(config: PoolConfig, source: TokenizerSource): PromptTokenizer {
  let tokenizer = tokenizers.get(config);
  if (tokenizer === undefined) {
    tokenizer = loadTokenizer('prefixAware.tokenizer', source, config.prefixAware.chatTemplateKwargs);
    tokenizers.set(config, tokenizer);
    // What it cannot render as vLLM does (gpt-oss chat, no chat template), said once at creation.
    for (const notice of tokenizer.notices) config.logger.warn(`express-dp-router: prefixAware.tokenizer ${notice}`);
  }
  return tokenizer;
}

/** Says once, at creation, that upstreams' `kvEvents` go unused (no exact prefix routing on the router's pool). */
export function warnUnusedKvEvents(pool: UpstreamPool, config: Pick<Configuration, 'logger'>): void {
  const notice = unusedKvEventsNotice(pool.table.upstreams, pool.exact !== undefined, pool.policy.name);
  if (notice !== undefined) config.logger.warn(notice);
}

/** Throws for entries this router cannot take (`kvEvents` under prefix-aware without a tokenizer), before anything changes. */
export function checkKvEventSources(config: Pick<Configuration, 'policy' | 'prefixAware'>, sources: readonly UpstreamConfig[]): void {
  requireTokenizerForKvEvents(sources, config.policy === 'prefix-aware', config.prefixAware.tokenizer);
}

/**
 * A pool's policy, built from its setting (a fresh built-in one, or the user's object) and put
 * in the router's form once ({@link routePolicy}), and the tokenizer exact prefix routing loads
 * for it (the built-in `'prefix-aware'` by name only).
 */
export function poolPolicy(setting: PolicyName | Policy, config: Pick<Configuration, 'affinity' | 'prefixAware'>): { policy: RoutePolicy; tokenizer: TokenizerSource | undefined } {
  return { policy: routePolicy(buildPolicy(setting, config)), tokenizer: exactTokenizer(setting, config.prefixAware) };
}

/**
 * The services of one pool of upstreams, built in dependency order and closed in the reverse:
 * its policy, endpoint table (in-flight counts and health), metric series, event composite,
 * exact prefix routing on its KV events, outlier detection and health checks (dpRouter only),
 * and the request inputs its hints are judged with. The router runs one for its upstreams, and
 * disaggregation one more for the prefill leg. What is not configured is not built.
 */
export class UpstreamPool {
  readonly policy: RoutePolicy;
  readonly table: EndpointTable;
  readonly metrics: RouterMetrics;
  /** Metrics, tracing and logs of this pool's events, told once. */
  readonly events: RouterEvents;
  readonly exact: ExactRouting | undefined;
  /** Route receipts; `undefined` when off. */
  readonly receipts: Receipts | undefined;
  readonly detector: OutlierDetector | undefined;
  /** Where evidence from this pool's traffic becomes a verdict for everyone (lib/verdicts). */
  readonly verdicts: Verdicts;
  readonly inputs: RequestInputs;
  private health: HealthChecker | undefined;
  private readonly healthChanged: HealthChange;
  private readonly scraped: (upstreams: readonly UpstreamConfig[]) => string[];
  /** What `close()` stops, in the order it was started. */
  private readonly started: Array<() => void | Promise<void>> = [];

  constructor(private readonly parts: PoolParts) {
    const { config } = parts;
    const policy = (this.policy = parts.policy);
    const table = (this.table = new EndpointTable(parts.upstreams));
    const scraped = (this.scraped = parts.scraped ?? NOT_SCRAPED);
    const metrics = (this.metrics = config.metrics ? createMetrics(parts.registry, config.metrics.prefix, table, scraped(table.upstreams)) : NO_METRICS);
    this.started.push(() => metrics.close());
    const events = (this.events = createEvents(metrics, parts.tracing, config.logger, policy.name, config.healthCheck));
    const verdicts = (this.verdicts = parts.verdicts ?? new Verdicts(config.verdicts, config.metrics, config.logger));
    verdicts.track(table.upstreams.map((upstream) => upstream.name));
    // Before exact routing, which routes each upstream through the receipts' gate.
    const receipts = (this.receipts =
      parts.receipts === undefined
        ? undefined
        : new Receipts({ config: parts.receipts, upstreams: table.upstreams, header: config.header, metrics: config.metrics, logger: config.logger, tracing: parts.tracing, verdicts }));
    if (receipts !== undefined) this.started.push(() => receipts.close());
    // Exact prefix routing: with a tokenizer, every upstream with `kvEvents` is subscribed to.
    const { tokenizer } = parts;
    const exact = (this.exact =
      tokenizer === undefined
        ? undefined
        : createExactRouting({
            upstreams: table.upstreams,
            tokenizer: tokenizerOf(config, tokenizer),
            metrics: config.metrics,
            isAdapter: parts.isAdapter,
            warn: (message) => config.logger.warn(message),
            receipts,
            tierWeights: config.prefixAware.tierWeights,
            verdicts,
          }));
    if (exact !== undefined) this.started.push(() => exact.close());
    const detector = (this.detector = config.outlierDetection ? new OutlierDetector(table, config.outlierDetection, { ejected: (endpoint) => events.ejected(endpoint as RouteEndpoint) }, verdicts) : undefined);
    if (detector !== undefined) this.started.push(() => detector.close());
    const told = parts.tellsHealthOf;
    this.healthChanged = told === undefined ? (endpoints, up) => events.healthChanged(endpoints, up) : (endpoints, up) => events.healthChanged(endpoints.filter(told), up);
    this.health = config.healthCheck ? startHealthChecks(table, config.healthCheck, this.healthChanged) : undefined;
    this.started.push(() => this.health?.stop());
    this.inputs = createRequestInputs({ hints: parts.hints ?? config.hints, affinity: config.affinity }, policy, table);
  }

  /**
   * Replaces the upstreams: requests in flight finish where they are; the pool's services
   * follow (metric series, exact streams, health checks). Returns what changed.
   */
  reconfigure(upstreams: readonly UpstreamConfig[]): ReturnType<EndpointTable['reconfigure']> {
    const { table } = this;
    const { healthCheck } = this.parts.config;
    const change = table.reconfigure(upstreams);
    this.metrics.track(change, this.scraped(table.upstreams));
    this.verdicts.track(table.upstreams.map((upstream) => upstream.name));
    this.receipts?.reconfigure(table.upstreams);
    this.exact?.reconfigure(table.upstreams);
    if (healthCheck) {
      this.health?.stop();
      this.health = startHealthChecks(table, healthCheck, this.healthChanged);
    }
    return change;
  }

  /** Stops its timers and sockets, last started first. */
  async close(): Promise<void> {
    for (const stop of [...this.started].reverse()) await stop();
  }
}
