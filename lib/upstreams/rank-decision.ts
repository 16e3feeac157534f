import type { DecisionSource, DpRankDecision } from '../types';

/**
 * `req.dpRank`: the decision as users see it, and nothing more: the router hands its state to
 * each stage itself and never reads it back from the request. Frozen, so that a later
 * middleware cannot change what another reads; and since it depends only on the endpoint and
 * the source, each endpoint makes its two once ({@link RouteEndpoint.decisions}) and requests
 * share them: no allocation and no `Object.freeze` (a map migration in V8) per request.
 */
export class RankDecision implements DpRankDecision {
  readonly upstream: string;
  readonly url: string;
  readonly rank: number | undefined;
  readonly source: DecisionSource;
  readonly headerValue: string | undefined;

  constructor(upstream: string, url: string, rank: number | undefined, source: DecisionSource, headerValue: string | undefined) {
    this.upstream = upstream;
    this.url = url;
    this.rank = rank;
    this.source = source;
    this.headerValue = headerValue;
    Object.freeze(this);
  }
}
