/** What carries the peers' messages: UDP datagrams to each replica, or a Redis channel. */
export interface PeerTransport {
  /** The largest message it carries whole: a batch larger than this is split, each part tagged. */
  readonly maxBytes: number;
  /** Sends one sealed message to every other replica; dropped while the transport is not ready. */
  send(message: Buffer): void;
  close(): Promise<void>;
}

/** What a transport tells the link. */
export interface TransportEvents {
  /** A message arrived (not yet authenticated). */
  received(message: Buffer): void;
  /** The transport can send now, or reaches replicas it did not before: announce everything. */
  ready(): void;
  /** Told to the log once per `kind`. */
  warnOnce(kind: string, message: string): void;
}
