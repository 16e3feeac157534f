import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import type { ServedModels } from './model-stage';

/** What a choice among balanced endpoints knows of the request: its model, where requests are routed by model. */
export interface BalancedRequest {
  readonly model: string | undefined;
}

/**
 * Where a request goes when vLLM picks its engine: to an upstream's balanced endpoint (no rank
 * claimed, no header sent; see `RouteEndpoint`). The upstream is chosen by load per engine,
 * (its ranks' load + its balanced requests) / its ranks, the least first, ties to the first
 * configured, since vLLM then balances among that server's engines by their own queues. Nothing
 * here is told to the policy: it records no choice that never happened.
 */
export class VllmBalancing {
  constructor(
    private readonly table: EndpointTable,
    private readonly pools: ServedModels,
  ) {}

  /** For a path vLLM balances itself: the least loaded upstream's balanced endpoint (among those serving the request's model), skipping `skip`. */
  pick(request: BalancedRequest, skip?: (endpoint: RouteEndpoint) => boolean): RouteEndpoint | undefined {
    return this.leastLoaded(this.table.healthyBalanced(), request, skip)?.endpoint;
  }

  /**
   * For a path routed by rank, while some upstream's rank header is not honoured: that upstream's
   * balanced endpoint when it is less loaded per engine than every rank `candidates` offer (or
   * they offer none); `undefined` when the policy should pick among `candidates`.
   */
  instead(request: BalancedRequest, candidates: readonly RouteEndpoint[]): RouteEndpoint | undefined {
    const best = this.leastLoaded(this.table.unhonouredBalanced(), request);
    if (best === undefined) return undefined;
    for (const candidate of candidates) if (candidate.load <= best.load) return undefined;
    return best.endpoint;
  }

  private leastLoaded(balanced: readonly RouteEndpoint[], request: BalancedRequest, skip?: (endpoint: RouteEndpoint) => boolean): { endpoint: RouteEndpoint; load: number } | undefined {
    const { model } = request;
    const byModel = model !== undefined && this.pools.active;
    let best: { endpoint: RouteEndpoint; load: number } | undefined;
    for (const endpoint of balanced) {
      if ((byModel && !this.pools.serves(endpoint.upstream, model)) || skip?.(endpoint) === true) continue;
      const ranks = this.table.ranksOf(endpoint);
      let load = endpoint.inflight;
      for (const rank of ranks) load += rank.load;
      load /= Math.max(1, ranks.length);
      if (best === undefined || load < best.load) best = { endpoint, load };
    }
    return best;
  }
}
