import { createSocket, type Socket } from 'node:dgram';
import { isIPv6 } from 'node:net';
import { pollName } from '../pools/dns-discovery';
import { MAX_DATAGRAM_BYTES } from './peer-datagram';
import { MAX_PEERS, type PeerAddress, type PeersConfig } from './peer-options';
import type { PeerTransport, TransportEvents } from './peer-transport';

/**
 * The peers over UDP: a socket bound to `listen` that sends each message to every configured
 * address and every address `dns` last resolved to (of the socket's family), one datagram each.
 * Socket errors are told once per kind; a taken port leaves the router on its own counts.
 */
export function startUdpTransport(config: PeersConfig, events: TransportEvents, warn: (message: string) => void): PeerTransport {
  const listen = config.listen!;
  const ipv6 = isIPv6(listen.host);
  const socket: Socket = createSocket({ type: ipv6 ? 'udp6' : 'udp4' });
  let bound = false;
  let closed = false;
  socket.on('message', (message) => events.received(message));
  socket.on('error', (error) => events.warnOnce(`error ${(error as NodeJS.ErrnoException).code}`, `socket error: ${error.message}.`));

  let targets: readonly PeerAddress[] = config.addresses.filter(({ host }) => isIPv6(host) === ipv6);
  const watch = config.dns === undefined ? undefined : watchPeerNames(config, warn, (found) => {
    targets = [...config.addresses, ...found].filter(({ host }) => isIPv6(host) === ipv6);
    // New replicas learn this one at once.
    events.ready();
  });
  socket.bind(listen.port, listen.host, () => {
    bound = true;
    socket.unref();
    events.ready();
  });

  return {
    maxBytes: MAX_DATAGRAM_BYTES,
    send(message) {
      if (!bound || closed) return;
      for (const { host, port } of targets) {
        socket.send(message, port, host, (error) => {
          if (error) events.warnOnce(`send ${(error as NodeJS.ErrnoException).code}`, `could not send to ${host}:${port}: ${error.message}.`);
        });
      }
    },
    close() {
      if (closed) return Promise.resolve();
      closed = true;
      watch?.stop();
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
