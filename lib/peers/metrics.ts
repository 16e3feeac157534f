import { Counter, Gauge } from 'prom-client';
import { family } from '../observe/metric-family';
import type { MetricsConfig } from '../observe/metrics';

/**
 * What became of a datagram from the peers' port or channel (`dp_router_peer_datagrams_total{outcome}`):
 * `replayed`, validly tagged but seen before (or older than its sender's last 32); `stale`,
 * validly tagged but signed at a time more than `ttlMs` from this replica's clock.
 */
export type DatagramOutcome = 'accepted' | 'bad_tag' | 'malformed' | 'replayed' | 'stale';

export const DATAGRAM_OUTCOMES: readonly DatagramOutcome[] = ['accepted', 'bad_tag', 'malformed', 'replayed', 'stale'];

/** The peer link's instruments; labels are fixed outcomes and configured endpoints, never a datagram's text. */
export interface PeerMetrics {
  datagram(outcome: DatagramOutcome): void;
  /** Replicas heard from within `ttlMs`, now (the change since the last call is applied). */
  peers(count: number): void;
}

export const NO_PEER_METRICS: PeerMetrics = { datagram: () => undefined, peers: () => undefined };

/**
 * The peer families on the router's registry (get-or-create, so routers can share them), at 0:
 * `dp_router_peers` (replicas heard from within `ttlMs`; routers sharing a registry add theirs)
 * and `dp_router_peer_datagrams_total{outcome}`. The peers' load per endpoint is in
 * `router.endpoints()` (`peerInflight`, `peerBlocks`).
 */
export function createPeerMetrics(config: MetricsConfig | undefined): PeerMetrics {
  if (config === undefined) return NO_PEER_METRICS;
  const { registry, prefix } = config;
  const peers = family(registry, `${prefix}peers`, Gauge, () => new Gauge({ name: `${prefix}peers`, help: 'Gateway replicas heard from within peers.ttlMs.', registers: [registry] }));
  const datagrams = family(registry, `${prefix}peer_datagrams_total`, Counter, () =>
    new Counter({ name: `${prefix}peer_datagrams_total`, help: "Datagrams on the peers' port or Redis channel, by what became of them.", labelNames: ['outcome'], registers: [registry] }),
  );
  peers.inc(0);
  for (const outcome of DATAGRAM_OUTCOMES) datagrams.inc({ outcome }, 0);
  let counted = 0;
  // Each outcome's series, looked up once: `inc({ outcome })` hashes the labels on every call.
  const series = Object.fromEntries(DATAGRAM_OUTCOMES.map((outcome) => [outcome, datagrams.labels({ outcome })])) as Record<DatagramOutcome, { inc(): void }>;
  return {
    datagram: (outcome) => series[outcome].inc(),
    peers: (count) => {
      if (count === counted) return;
      peers.inc(count - counted);
      counted = count;
    },
  };
}
