import { admissionHooks } from '../admission/route-hooks';
import type { Admission } from '../admission/admission';
import { metricHooks } from '../observe/route-hooks';
import type { RouterMetrics } from '../observe/metrics';
import type { PeerAnnouncer } from '../peers/peer-link';
import { peerHooks } from '../peers/route-hooks';
import { firstTokenLearning } from '../policies/route-hooks';
import { sloHooks } from '../slo/route-hooks';
import type { SloRouting } from '../slo/slo-routing';
import { receiptHooks } from '../receipts/route-hooks';
import type { Receipts } from '../receipts/receipts';
import { RouteSeam } from '../request/route-hooks';
import type { RouteState } from '../request/route-state';
import type { RoutePolicy } from '../policies/route-policy';
import type { OutlierDetector } from '../upstreams/outlier-detector';
import type { RankHeaderGuard } from '../upstreams/rank-header-guard';
import { outlierHooks, rankHeaderHooks } from '../upstreams/route-hooks';

/** The services features are built from (the router's, see services.ts); what is off is `undefined`. */
export interface FeatureServices {
  readonly policy: RoutePolicy;
  readonly metrics: RouterMetrics;
  readonly peers: PeerAnnouncer | undefined;
  readonly admission: Admission | undefined;
  readonly receipts: Receipts | undefined;
  readonly rankHeaders: RankHeaderGuard;
  readonly detector: OutlierDetector | undefined;
  readonly slo: SloRouting | undefined;
}

/**
 * The router's extension points (request/route-hooks.ts), one line per feature; what is not
 * configured registers nothing. Each point calls them in this order (`closing` and `closed` in
 * the reverse): admission counts an answer's tokens before receipts may take a usage chunk out
 * of it, and frees a closed request's slot last, once every other feature has counted it out
 * (docs/architecture.md).
 */
export function routeSeam(s: FeatureServices): RouteSeam<RouteState> {
  const seam = new RouteSeam<RouteState>();
  const { policy } = s;
  if (s.admission !== undefined) seam.add(admissionHooks(s.admission));
  seam.add(rankHeaderHooks(s.rankHeaders));
  if (s.receipts !== undefined) seam.add(receiptHooks(s.receipts));
  if (s.peers !== undefined) seam.add(peerHooks(s.peers, policy.reportsUncachedBlocks));
  seam.add(metricHooks(s.metrics));
  if (policy.learnsFirstTokens) seam.add(firstTokenLearning());
  if (s.slo !== undefined) seam.add(sloHooks(s.slo));
  if (s.detector !== undefined) seam.add(outlierHooks(s.detector));
  return seam;
}
