import { createSecretKey, randomInt } from 'node:crypto';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import { claimedSender, decodeDatagram, encodeDatagrams, type PeerRecord } from './peer-datagram';
import type { PeersConfig } from './peer-options';
import { PeerTable } from './peer-table';
import type { PeerMetrics } from './metrics';
import type { PeerTransport, TransportEvents } from './peer-transport';
import { startRedisTransport } from './redis-transport';
import { startUdpTransport } from './udp-transport';

/**
 * What the request path tells the peers: an endpoint's own counts changed. It adds to the
 * endpoint's time-weighted in-flight count and arms the next batch (at most one timer per
 * `announceMs`); which endpoints changed, and by how much, is read when the batch goes.
 */
export interface PeerAnnouncer {
  changed(endpoint: RouteEndpoint): void;
}

/** The running link: {@link PeerAnnouncer}, plus what the services drive. */
export interface PeerLink extends PeerAnnouncer {
  /** The endpoints were rebuilt (`setUpstreams`, discovery): the peers' sums go onto the new ones. */
  sync(): void;
  close(): Promise<void>;
}

/** What was last announced of one endpoint. */
interface Announced {
  inflight: number;
  blocks: number;
}

/**
 * An endpoint's own in-flight count over the batch being gathered. A batch announces its mean
 * over the interval, weighted by time, not the count at the instant the batch goes: under a
 * steady load whose requests come and go within an interval (a burst, answered at once) the
 * instant is noise that would be worth a batch every interval, whatever the request rate; the
 * mean moves only when the load does.
 */
interface Interval {
  /** When the interval began: the last batch, or the endpoint's first change since. */
  from: number;
  /** When the count last changed, and what it has been since. */
  at: number;
  value: number;
  /** The count integrated over time from `from` to `at` (request·ms). */
  area: number;
}

/**
 * Whether an endpoint's counts moved enough since they were last announced to be worth a
 * record before the heartbeat: by at least 1 and an eighth of what was announced (a request
 * more on an idle endpoint matters; one more of forty, less than the forty's own churn).
 */
function matters(last: Announced | undefined, inflight: number, blocks: number): boolean {
  if (last === undefined) return true;
  const moved = inflight - last.inflight;
  const movedBlocks = blocks - last.blocks;
  return (moved < 0 ? -moved : moved) * 8 >= (last.inflight > 8 ? last.inflight : 8) || (movedBlocks < 0 ? -movedBlocks : movedBlocks) * 8 >= (last.blocks > 8 ? last.blocks : 8);
}

/**
 * Starts the link to the other replicas over its transport (UDP, or Redis pub/sub): receives
 * their announcements into `endpoint.peerInflight`/`peerBlocks`, and announces this replica's
 * own `inflight`/`sentBlocks`: changes gathered for `announceMs` after the first (one batch, one
 * tag, only the endpoints whose counts moved enough: {@link matters}), and every endpoint each
 * `heartbeatMs`. Nothing of this runs on a request's path but arming that one timer. Transport
 * errors and refused messages are told to `warn` once per kind; nothing a message holds can
 * throw or grow memory past the table's bounds.
 */
export function startPeers(config: PeersConfig, table: EndpointTable, metrics: PeerMetrics, warn: (message: string) => void): PeerLink {
  const self = randomInt(0, 2 ** 32 - 1);
  const secret = createSecretKey(config.secret);
  table.withPeers = true;
  // A forgotten sender's window outlives the time its datagrams pass the clock check (below):
  // one sent at its last heartbeat passes it for at most ttlMs + skew (≤ ttlMs) after that.
  const peers = new PeerTable(self, 2 * config.ttlMs);
  let seq = 0;
  let closed = false;
  let armed = false;
  /** What was last announced, by endpoint key. */
  const announced = new Map<string, Announced>();
  /** Each endpoint's count over the batch being gathered, once it changed. */
  let intervals = new Map<RouteEndpoint, Interval>();
  /** Endpoints `sync()` removed that still had requests, announced until they end. */
  let retiring: RouteEndpoint[] = [];
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
      // This replica's own, back from Redis or from its own address: not counted, not checked.
      if (claimedSender(message) === self) return;
      const datagram = decodeDatagram(message, secret, transport.maxBytes);
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
    ready: () => ready(),
    warnOnce,
  };
  const transport: PeerTransport = config.redis === undefined ? startUdpTransport(config, events, warn) : startRedisTransport(config.redis, events);

  const send = (records: PeerRecord[]) => {
    if (closed) return;
    const datagrams = encodeDatagrams(self, seq, Date.now(), records, secret, transport.maxBytes);
    seq = (seq + datagrams.length) >>> 0;
    for (const datagram of datagrams) transport.send(datagram);
  };
  /**
   * Adds `endpoint`'s record to `records` when `all` (the heartbeat: every count as it is now),
   * when its count held one value through the interval and that is not what was announced (a
   * level is announced exactly), or when its in-flight mean over the interval, or its blocks,
   * moved enough; and remembers it as announced. Returns whether its count now differs from
   * what was announced, for another batch to look again.
   */
  const collect = (records: PeerRecord[], endpoint: RouteEndpoint, all: boolean, now: number): boolean => {
    const { key, inflight: current, sentBlocks: blocks } = endpoint;
    const interval = intervals.get(endpoint);
    const steady = interval === undefined || interval.at === interval.from;
    let inflight = current;
    if (interval !== undefined) {
      const span = now - interval.from;
      if (!all && !steady && span > 0) inflight = (interval.area + interval.value * (now - interval.at)) / span;
      interval.from = interval.at = now;
      interval.area = 0;
      interval.value = current;
    }
    let last = announced.get(key);
    if (all || matters(last, inflight, blocks) || (steady && last!.inflight !== current)) {
      records.push({ key, inflight, blocks });
      if (last === undefined) announced.set(key, (last = { inflight, blocks }));
      else {
        last.inflight = inflight;
        last.blocks = blocks;
      }
    }
    return last !== undefined && last.inflight !== current;
  };
  /** Announces what moved (or everything: `all`); whether some count still differs from its announcement. */
  const announce = (all: boolean): boolean => {
    const now = performance.now();
    const records: PeerRecord[] = [];
    let unsettled = false;
    for (const endpoint of table.all) unsettled = collect(records, endpoint, all, now) || unsettled;
    for (const endpoint of retiring) unsettled = collect(records, endpoint, all, now) || unsettled;
    if (all || records.length > 0) send(records);
    return unsettled;
  };
  const arm = () => {
    armed = true;
    setTimeout(batch, config.announceMs).unref();
  };
  const batch = () => {
    armed = false;
    // A count that settled at a new level after the interval's mean was taken is announced by
    // the next batch, changes or not: within two intervals of a step.
    if (announce(false) && !closed) arm();
  };
  const heartbeat = setInterval(() => {
    const now = performance.now();
    copy(peers.expire(now - config.ttlMs, now));
    metrics.peers(peers.size);
    announce(true);
    // A removed endpoint is announced at 0 in a heartbeat (and by a batch before, as its last
    // request ended) before it is left out: twice, in case one was lost.
    if (retiring.length > 0) retiring = retiring.filter((endpoint) => endpoint.inflight > 0 || endpoint.sentBlocks > 0);
    if (intervals.size > table.all.length + retiring.length) {
      const kept = new Set([...table.all, ...retiring]);
      intervals = new Map([...intervals].filter(([endpoint]) => kept.has(endpoint)));
    }
  }, config.heartbeatMs).unref();
  const ready = () => announce(true);
  /** The endpoints as of the last `sync()`, to keep announcing those it removes. */
  let current = new Set(table.all);

  return {
    changed(endpoint) {
      if (closed) return;
      const now = performance.now();
      const interval = intervals.get(endpoint);
      if (interval === undefined) {
        intervals.set(endpoint, { from: now, at: now, value: endpoint.inflight, area: 0 });
      } else {
        interval.area += interval.value * (now - interval.at);
        interval.at = now;
        interval.value = endpoint.inflight;
      }
      if (!armed) arm();
    },
    sync() {
      for (const endpoint of table.all) {
        endpoint.peerInflight = 0;
        endpoint.peerBlocks = 0;
      }
      copy(peers.keys());
      // Heartbeats cover the endpoints there are now and those removed until their requests end.
      const next = new Set(table.all);
      const kept = new Set(table.all.map((endpoint) => endpoint.key));
      for (const endpoint of current) if (!next.has(endpoint) && !kept.has(endpoint.key)) retiring.push(endpoint);
      retiring = retiring.filter((endpoint) => !kept.has(endpoint.key));
      current = next;
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
