import type { IncomingMessage } from 'node:http';

/** Built-in assignment policies, by name. */
export type PolicyName =
  | 'least-outstanding'
  | 'round-robin'
  | 'random'
  | 'power-of-two'
  | 'session-affinity'
  | 'prefix-aware';

/** One (upstream, global rank) pair that requests can be routed to. */
export interface Endpoint {
  /** Unique within a router: `<upstream>#<rank>`. */
  readonly key: string;
  /** The upstream's name. */
  readonly upstream: string;
  /** The global data-parallel rank. */
  readonly rank: number;
  /** Requests dispatched by this router and not yet finished. */
  readonly inflight: number;
  /** The load policies balance on: `inflight`, plus engine load where load feedback is on. */
  readonly load: number;
  /** Whether the endpoint is in rotation. */
  readonly healthy: boolean;
}

/** What a policy may know of the request, as plain values. */
export interface PickContext {
  /** The request path as the client sent it (mount path included), e.g. `/v1/chat/completions`. */
  readonly path: string;
  /** The session key, for policies with `usesAffinityKey`. */
  readonly affinityKey: string | undefined;
  /** The prompt text, for policies with `usesPrompt`, when the body carries one. */
  readonly prompt: string | undefined;
}

/** An assignment policy. Candidates are never empty and are all healthy. */
export interface Policy {
  readonly name: string;
  pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint;
  /** Ask the router to read the body and pass `ctx.prompt`. */
  readonly usesPrompt?: boolean;
  /** Ask the router to read the session key into `ctx.affinityKey`. */
  readonly usesAffinityKey?: boolean;
  /**
   * `false`: the policy reads nothing of `ctx`, so the router passes one shared context instead
   * of making one per request. Leave it out when the policy reads `ctx.path`.
   */
  readonly readsContext?: boolean;
  /**
   * The policy scores candidates on a prefix index: where exact prefix routing applies, the
   * router adds the exact index's view (`ctx.exact`, see `prefixAware`), and `exposeDecision`
   * names the index that scored the pick (`; index=exact|approximate`).
   */
  readonly namesIndex?: boolean;
  /** The policy reports {@link matchedShare} after each pick, for tracing. */
  readonly reportsMatchedShare?: boolean;
  /** With `reportsMatchedShare`: the share of the last picked prompt the chosen endpoint was estimated to hold (read by the router right after each pick). */
  readonly matchedShare?: number;
  /**
   * The policy reads each candidate's first-token totals (`firstTokens`, `firstTokenSeconds`,
   * see `FirstTokenTotals`), which dpRouter then keeps for every endpoint from its answers'
   * first events; without it they stay 0 and cost nothing per request.
   */
  readonly learnsFirstTokens?: boolean;
  /**
   * The prefill the last pick sends, in the policy's own units (`prefix-aware`: the prompt's
   * blocks the chosen endpoint was estimated to lack). With `peers` the router announces the sum
   * per endpoint, until each request's first token, to the other replicas' policies, which read
   * it as the endpoint's `peerBlocks` (see `PeerLoad`). Read by the router right after each pick.
   */
  readonly uncachedBlocks?: number;
}

/** Where the chosen rank came from. */
export type DecisionSource = 'hint' | 'assigned';

/** What became of a rank hint (`dp_router_rank_hints_total{outcome}`). */
export type HintOutcome = 'accepted' | 'untrusted' | 'malformed' | 'out_of_range' | 'unavailable';

/** How a try at an upstream failed (`dp_router_upstream_errors_total{kind}`). */
export type UpstreamErrorKind = 'connect' | 'timeout' | 'reset' | 'status_5xx';

/** Which prefix index scored a pick. */
export type IndexSource = 'exact' | 'approximate';

/** The routing decision for one request, set as `req.dpRank`. */
export interface DpRankDecision {
  /** The chosen upstream's name. */
  readonly upstream: string;
  /** The chosen upstream's URL. */
  readonly url: string;
  /**
   * The global rank; `undefined` when vLLM picks the engine: on a path it does not route by the
   * rank header (`/v1/responses`, embeddings, pooling, score, rerank, classify), or for an
   * upstream whose rank header it does not honour. No rank header is sent then.
   */
  readonly rank: number | undefined;
  readonly source: DecisionSource;
  /** The rank header value sent upstream, or `undefined` for `rankHeader: 'none'`. */
  readonly headerValue: string | undefined;
}

/** A point-in-time view of one endpoint. */
export interface EndpointSnapshot {
  upstream: string;
  rank: number;
  inflight: number;
  healthy: boolean;
  /** With `peers`: the other gateway replicas' requests in flight here, as they last announced them. */
  peerInflight?: number;
  /** With `peers`: the prefill those requests still wait for, in the announcing policy's units (`uncachedBlocks`). */
  peerBlocks?: number;
  /** With `disaggregation`: `'prefill'` on the prefill pool's endpoints (the others serve decode legs and whole requests). */
  leg?: 'prefill';
}

// On 'http', which 'node:http' re-exports: augmenting 'node:http' breaks the type check of a
// program that also loads pino's types ("IncomingMessage incorrectly extends Readable").
declare module 'http' {
  interface IncomingMessage {
    /**
     * The routing decision, set by `dpRank()` and `dpRouter()`. Under Express it is read through
     * an accessor on Express's request prototype from the response's `res.locals`, not an own
     * property of the request (assigning it makes one).
     */
    dpRank?: DpRankDecision;
  }
}
