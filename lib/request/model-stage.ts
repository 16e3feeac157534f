import type { IncomingMessage, ServerResponse } from 'node:http';
import type { RouteEndpoint } from '../upstreams/endpoints';

/** Which models the upstreams serve, as the request path reads it (pools/model-pools.ts's `ModelPools`). */
export interface ServedModels {
  /** Whether requests are routed by model now (so their JSON bodies are read). */
  readonly active: boolean;
  /** Whether the gateway answers `GET /v1/models` with the union of the upstreams' models. */
  readonly listed: boolean;
  serves(upstream: string, model: string): boolean;
}

/**
 * Routing by model, the lifecycle's stage between the body and the pick (pools/model-routing.ts
 * is the one implementation): the `GET /v1/models` union, a request's model pool, a retry's.
 */
export interface ModelStage {
  readonly pools: ServedModels;
  answersModelList(req: IncomingMessage & { originalUrl?: string }): boolean;
  sendModelList(res: ServerResponse): void;
  /** The healthy endpoints serving `model`; `undefined` when it was answered instead (400, 404). */
  candidatesFor(res: ServerResponse, path: string, model: unknown): readonly RouteEndpoint[] | undefined;
  /** Where a retry of a request for `model` may go. */
  retryCandidates(model: string | undefined): readonly RouteEndpoint[];
  /** A request for `model` went to `endpoint` (the LoRA preference learns from it). */
  sent(model: string, endpoint: RouteEndpoint): void;
}

/** The least loaded endpoint of `rank` among `candidates` (a hinted rank within a model's pool, or its retry), leaving out those `skip` names. */
export function leastLoadedOfRank(candidates: readonly RouteEndpoint[], rank: number, skip?: (endpoint: RouteEndpoint) => boolean): RouteEndpoint | undefined {
  let best: RouteEndpoint | undefined;
  for (const endpoint of candidates) {
    if (endpoint.rank === rank && (best === undefined || endpoint.load < best.load) && (skip === undefined || !skip(endpoint))) best = endpoint;
  }
  return best;
}
