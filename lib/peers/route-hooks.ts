import type { RouteEndpoint } from '../upstreams/endpoints';
import type { PickResult } from '../policies/pick-result';
import type { PeerAnnouncer } from './peer-link';

/** What the peer link keeps on a request (`RouteState.prefillBlocks`): the prefill blocks announced for it. */
interface PrefillCarrier {
  prefillBlocks: number;
}

/**
 * The peer link on the request's way (request/route-hooks.ts): each change to an endpoint's own
 * counts is announced, and a pick's prefill (its result's `uncachedBlocks`, from a policy that reports it) counts
 * in its endpoint's `sentBlocks` until its first token (or its end). A balanced endpoint is no
 * rank the peers know.
 */
export function peerHooks(peers: PeerAnnouncer, reportsUncachedBlocks: boolean) {
  const prefilled = (route: PrefillCarrier, endpoint: RouteEndpoint): void => {
    const blocks = route.prefillBlocks;
    if (blocks === 0) return;
    route.prefillBlocks = 0;
    endpoint.sentBlocks = endpoint.sentBlocks > blocks ? endpoint.sentBlocks - blocks : 0;
    peers.changed(endpoint);
  };
  return {
    name: 'peers',
    decided: reportsUncachedBlocks
      ? (route: PrefillCarrier, found: PickResult): void => {
          route.prefillBlocks = found.uncachedBlocks ?? 0;
        }
      : undefined,
    held(route: PrefillCarrier, endpoint: RouteEndpoint): void {
      if (endpoint.balanced) return;
      endpoint.sentBlocks += route.prefillBlocks;
      peers.changed(endpoint);
    },
    retrying(route: PrefillCarrier, from: RouteEndpoint): void {
      from.sentBlocks -= route.prefillBlocks;
      if (!from.balanced) peers.changed(from);
    },
    firstToken(route: PrefillCarrier, endpoint: RouteEndpoint, _seconds: number, streamed: boolean): void {
      if (streamed) prefilled(route, endpoint);
    },
    watchesFirstToken: (route: PrefillCarrier): boolean => route.prefillBlocks > 0,
    closed(route: PrefillCarrier, endpoint: RouteEndpoint): void {
      if (endpoint.balanced) return;
      prefilled(route, endpoint);
      peers.changed(endpoint);
    },
  };
}
