import { randomInt } from 'node:crypto';
import { createSocket, type Socket } from 'node:dgram';
import { isIPv6 } from 'node:net';
import { pollName } from '../pools/dns-discovery';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import { decodeDatagram, encodeDatagrams, type PeerRecord } from './peer-datagram';
import { MAX_PEERS, type PeerAddress, type PeersConfig } from './peer-options';
import { PeerTable } from './peer-table';
import type { PeerMetrics } from './metrics';

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
 * Starts the UDP link to the other replicas: receives their announcements into
 * `endpoint.peerInflight`/`peerBlocks`, and announces this replica's own `inflight`/`sentBlocks`
 * of each endpoint that changed, once per event-loop turn (a burst of requests is one datagram
 * per peer), and of every endpoint each `heartbeatMs`. Socket errors and refused datagrams are
 * told to `warn` once per kind; nothing a datagram holds can throw or grow memory past the
 * table's bounds.
 */
export function startPeers(config: PeersConfig, table: EndpointTable, metrics: PeerMetrics, warn: (message: string) => void): PeerLink {
  const self = randomInt(0, 2 ** 32 - 1);
  table.withPeers = true;
  const peers = new PeerTable(self);
  const ipv6 = isIPv6(config.listen.host);
  const socket: Socket = createSocket({ type: ipv6 ? 'udp6' : 'udp4' });
  let seq = 0;
  let bound = false;
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

  socket.on('message', (message) => {
    const datagram = decodeDatagram(message, config.secret);
    if (datagram === 'tag') {
      metrics.datagram('bad_tag');
      return warnOnce('tag', 'dropped a datagram without a valid tag (another secret, or not a replica); further ones are only counted (dp_router_peer_datagrams_total).');
    }
    if (datagram === 'malformed') {
      metrics.datagram('malformed');
      return warnOnce('malformed', 'dropped a malformed datagram (another version?); further ones are only counted (dp_router_peer_datagrams_total).');
    }
    metrics.datagram('accepted');
    copy(peers.apply(datagram, performance.now()));
    metrics.peers(peers.size);
  });
  socket.on('error', (error) => warnOnce(`error ${(error as NodeJS.ErrnoException).code}`, `socket error: ${error.message}.`));

  /** Where announcements go: the configured addresses and what `dns` last resolved to, of the socket's family. */
  let targets: readonly PeerAddress[] = config.addresses.filter(({ host }) => isIPv6(host) === ipv6);
  const send = (records: PeerRecord[]) => {
    if (!bound || closed) return;
    const datagrams = encodeDatagrams(self, seq, records, config.secret);
    seq = (seq + datagrams.length) >>> 0;
    for (const datagram of datagrams) {
      for (const { host, port } of targets) {
        socket.send(datagram, port, host, (error) => {
          if (error) warnOnce(`send ${(error as NodeJS.ErrnoException).code}`, `could not send to ${host}:${port}: ${error.message}.`);
        });
      }
    }
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
    copy(peers.expire(performance.now() - config.ttlMs));
    metrics.peers(peers.size);
    send(table.all.map(recordOf));
  }, config.heartbeatMs).unref();

  const watch = config.dns === undefined ? undefined : watchPeerNames(config, warn, (found) => {
    targets = [...config.addresses, ...found].filter(({ host }) => isIPv6(host) === ipv6);
    // New replicas learn this one at once.
    send(table.all.map(recordOf));
  });

  socket.bind(config.listen.port, config.listen.host, () => {
    bound = true;
    socket.unref();
    // Peers learn this replica at once, not at the first heartbeat.
    send(table.all.map(recordOf));
  });

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
      watch?.stop();
      metrics.peers(0);
      return new Promise<void>((resolve) => {
        try {
          socket.close(() => resolve());
        } catch {
          resolve();
        }
      });
    },
  };
}

/**
 * Calls `found` with the addresses of `config.dns` whenever they change (see {@link pollName}).
 * A failure keeps the last addresses, and is told once per outage; no records: no replicas.
 */
function watchPeerNames(config: PeersConfig, warn: (message: string) => void, found: (addresses: PeerAddress[]) => void): { stop(): void } {
  const dns = config.dns!;
  let last = '';
  let failing = false;
  return pollName(dns, (result) => {
    if (result.outcome === 'failed') {
      if (!failing) warn(`express-dp-router: peers: resolving '${dns.name}' failed (${result.code}); announcing to its last addresses until it answers again.`);
      failing = true;
      return;
    }
    failing = false;
    const addresses = result.outcome === 'ok' ? result.addresses : [];
    const key = addresses.join(',');
    if (key === last) return;
    last = key;
    if (addresses.length > MAX_PEERS) warn(`express-dp-router: peers: '${dns.name}' resolves to ${addresses.length} addresses; announcing to the first ${MAX_PEERS}.`);
    found(addresses.slice(0, MAX_PEERS).map((host) => ({ host, port: dns.port })));
  });
}
