import type { RedisPeersConfig } from './peer-options';
import type { PeerTransport, TransportEvents } from './peer-transport';

/**
 * Redis has no datagram size: a batch is one message, under one tag. Bounded all the same, so
 * that what a subscriber accepts stays small whatever another writer publishes.
 */
export const MAX_REDIS_MESSAGE_BYTES = 64 * 1024;

/**
 * The peers over Redis pub/sub: each message is published once on `channel` with the user's
 * client (Redis fans it out to every subscriber, this replica's own included, which the link
 * ignores by its sender id), and heard on a duplicate connection the transport made and closes.
 * A failed publish or subscription is told once per kind; the router then routes on what it
 * knows, as with a taken UDP port.
 */
export function startRedisTransport(config: RedisPeersConfig, events: TransportEvents): PeerTransport {
  const { client, channel } = config;
  let closed = false;
  const subscriber = client.subscriber(
    channel,
    (message) => {
      if (!closed) events.received(message);
    },
    (error) => events.warnOnce(`redis ${(error as NodeJS.ErrnoException).code ?? error.message}`, `Redis subscriber: ${error.message}.`),
  );
  subscriber.ready.then(
    () => {
      if (!closed) events.ready();
    },
    (error: Error) => events.warnOnce('subscribe', `could not subscribe to '${channel}': ${error.message}; announcing without hearing the peers.`),
  );
  return {
    maxBytes: MAX_REDIS_MESSAGE_BYTES,
    send(message) {
      if (closed) return;
      client.publish(channel, message).catch((error: Error) => events.warnOnce('publish', `could not publish on '${channel}': ${error.message}.`));
    },
    async close() {
      if (closed) return;
      closed = true;
      await subscriber.close();
    },
  };
}
