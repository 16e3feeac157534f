import { randomInt } from 'node:crypto';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import { decodeDatagram, encodeDatagrams, type PeerRecord } from './peer-datagram';
import type { PeersConfig } from './peer-options';
import { PeerTable } from './peer-table';
import type { PeerMetrics } from './metrics';
import type { PeerTransport, TransportEvents } from './peer-transport';
import { startRedisTransport } from './redis-transport';
import { startUdpTransport } from './udp-transport';

/** What the request path tells the peers: an endpoint's own counts changed. */
export interface PeerAnnouncer {
  changed(endpoint: RouteEndpoint): void;
}

/** The running link: {@link PeerAnnouncer}, plus what the services drive. */
export interface PeerLink extends PeerAnnouncer {
  /** The endpoints were rebuilt (`setUpstreams`, discovery): the peers' sums go onto the new ones. */
  sync(): void;
  close(): Promise<void>;
}

/**
 * Starts the link to the other replicas over its transport (UDP, or Redis pub/sub): receives
 * their announcements into `endpoint.peerInflight`/`peerBlocks`, and announces this replica's
 * own `inflight`/`sentBlocks` of each endpoint that changed, once per event-loop turn (a burst
 * of requests is one message), and of every endpoint each `heartbeatMs`. Transport errors and
 * refused messages are told to `warn` once per kind; nothing a message holds can throw or grow
 * memory past the table's bounds.
 */
export function startPeers(config: PeersConfig, table: EndpointTable, metrics: PeerMetrics, warn: (message: string) => void): PeerLink {
  const self = randomInt(0, 2 ** 32 - 1);
  table.withPeers = true;
  // A forgotten sender's window outlives the time its datagrams pass the clock check (below):
  // one sent at its last heartbeat passes it for at most ttlMs + skew (≤ ttlMs) after that.
  const peers = new PeerTable(self, 2 * config.ttlMs);
  let seq = 0;
  let closed = false;
  const dirty = new Set<RouteEndpoint>();
  let flushing = false;
  const warned = new Set<string>();
  const warnOnce = (kind: string, message: string) => {
    if (warned.has(kind)) return;
    warned.add(kind);
    warn(`express-dp-router: peers: ${message}`);
  };

  let byKey = new Map<string, RouteEndpoint>();
  let indexed: readonly RouteEndpoint[] | undefined;
  const endpointOf = (key: string): RouteEndpoint | undefined => {
    if (indexed !== table.all) {
      indexed = table.all;
      byKey = new Map(indexed.map((endpoint) => [endpoint.key, endpoint]));
    }
    return byKey.get(key);
  };
  const copy = (keys: Iterable<string>) => {
    for (const key of keys) {
      const endpoint = endpointOf(key);
      const totals = peers.totalsOf(key);
      if (endpoint === undefined || totals === undefined) continue;
      endpoint.peerInflight = totals.inflight;
      endpoint.peerBlocks = totals.blocks;
    }
  };

  const events: TransportEvents = {
    received(message) {
      const datagram = decodeDatagram(message, config.secret, transport.maxBytes);
      if (datagram === 'tag') {
        metrics.datagram('bad_tag');
        return warnOnce('tag', 'dropped a datagram without a valid tag (another secret, or not a replica); further ones are only counted (dp_router_peer_datagrams_total).');
      }
      if (datagram === 'malformed') {
        metrics.datagram('malformed');
        return warnOnce('malformed', 'dropped a malformed datagram (another version?); further ones are only counted (dp_router_peer_datagrams_total).');
      }
      const skew = Date.now() - datagram.sentAt;
      if (skew > config.ttlMs || skew < -config.ttlMs) {
        metrics.datagram('stale');
        return warnOnce('stale', `dropped a datagram signed ${Math.round(skew)} ms from this replica's clock, past ttlMs (${config.ttlMs}): a replay, or the replicas' clocks disagree (NTP); further ones are only counted (dp_router_peer_datagrams_total).`);
      }
      const changed = peers.apply(datagram, performance.now());
      if (changed === 'replayed') {
        metrics.datagram('replayed');
        return warnOnce('replayed', 'dropped a datagram seen before (a replay); further ones are only counted (dp_router_peer_datagrams_total).');
      }
      metrics.datagram('accepted');
      copy(changed);
      metrics.peers(peers.size);
    },
    // Peers learn this replica at once, not at the first heartbeat.
    ready: () => send(table.all.map(recordOf)),
    warnOnce,
  };
  const transport: PeerTransport = config.redis === undefined ? startUdpTransport(config, events, warn) : startRedisTransport(config.redis, events);

  const send = (records: PeerRecord[]) => {
    if (closed) return;
    const datagrams = encodeDatagrams(self, seq, Date.now(), records, config.secret, transport.maxBytes);
    seq = (seq + datagrams.length) >>> 0;
    for (const datagram of datagrams) transport.send(datagram);
  };
  const recordOf = (endpoint: RouteEndpoint): PeerRecord => ({ key: endpoint.key, inflight: endpoint.inflight, blocks: endpoint.sentBlocks });
  const flush = () => {
    flushing = false;
    const records = [...dirty].map(recordOf);
    dirty.clear();
    send(records);
  };
  /** The endpoints as of the last `sync()`, to announce once more those it removes. */
  let announced = new Map(table.all.map((endpoint) => [endpoint.key, endpoint]));
  const heartbeat = setInterval(() => {
    const now = performance.now();
    copy(peers.expire(now - config.ttlMs, now));
    metrics.peers(peers.size);
    send(table.all.map(recordOf));
  }, config.heartbeatMs).unref();

  return {
    changed(endpoint) {
      dirty.add(endpoint);
      if (flushing) return;
      flushing = true;
      setImmediate(flush);
    },
    sync() {
      for (const endpoint of table.all) {
        endpoint.peerInflight = 0;
        endpoint.peerBlocks = 0;
      }
      copy(peers.keys());
      // Heartbeats cover only the endpoints there are now: a removed one's requests announce
      // their ends as they close, and this repeats its counts once more in case one was lost.
      const kept = new Set(table.all.map((endpoint) => endpoint.key));
      const gone = [...announced.values()].filter((endpoint) => !kept.has(endpoint.key));
      announced = new Map(table.all.map((endpoint) => [endpoint.key, endpoint]));
      if (gone.length > 0) setTimeout(() => send(gone.map(recordOf)), config.heartbeatMs).unref();
    },
    close() {
      if (closed) return Promise.resolve();
      closed = true;
      clearInterval(heartbeat);
      metrics.peers(0);
      return transport.close();
    },
  };
}
