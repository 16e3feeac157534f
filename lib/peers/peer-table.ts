import type { PeerDatagram } from './peer-datagram';

/** The other replicas' load on one endpoint: the sums of what each announced last. */
export interface PeerTotals {
  inflight: number;
  blocks: number;
}

interface Announced {
  inflight: number;
  blocks: number;
  /** The datagram that carried it, so that an older one arriving late is ignored. */
  seq: number;
}

interface Sender {
  heardAt: number;
  readonly keys: Map<string, Announced>;
}

/** More senders than a deployment has replicas: past it, new ones are ignored until some expire. */
const MAX_SENDERS = 256;
/** More endpoints than one router routes to. */
const MAX_KEYS_PER_SENDER = 4_096;

/** Whether `seq` comes after `last` in a 32-bit counter that wraps. */
function isNewer(seq: number, last: number): boolean {
  const ahead = (seq - last) >>> 0;
  return ahead !== 0 && ahead < 0x80000000;
}

/**
 * What every peer announced last, per endpoint key, and the sums over peers, pure: the link
 * applies datagrams to it and copies the sums of the keys that changed onto its endpoints. Its
 * memory is bounded by {@link MAX_SENDERS} × {@link MAX_KEYS_PER_SENDER}, whatever arrives.
 */
export class PeerTable {
  private readonly senders = new Map<number, Sender>();
  private readonly totals = new Map<string, PeerTotals>();

  constructor(private readonly self: number) {}

  /** Replicas heard from (and not yet expired). */
  get size(): number {
    return this.senders.size;
  }

  /** The sums for `key`, or `undefined` when no peer announced it. */
  totalsOf(key: string): PeerTotals | undefined {
    return this.totals.get(key);
  }

  /** Every key with sums. */
  keys(): IterableIterator<string> {
    return this.totals.keys();
  }

  /** Applies a datagram heard at `now`; returns the keys whose sums changed (none for this replica's own). */
  apply(datagram: PeerDatagram, now: number): string[] {
    if (datagram.sender === this.self) return [];
    let sender = this.senders.get(datagram.sender);
    if (sender === undefined) {
      if (this.senders.size >= MAX_SENDERS) return [];
      sender = { heardAt: now, keys: new Map() };
      this.senders.set(datagram.sender, sender);
    }
    sender.heardAt = now;
    const changed: string[] = [];
    for (const { key, inflight, blocks } of datagram.records) {
      const last = sender.keys.get(key);
      if (last === undefined) {
        if (sender.keys.size >= MAX_KEYS_PER_SENDER) continue;
        sender.keys.set(key, { inflight, blocks, seq: datagram.seq });
        this.add(key, inflight, blocks);
      } else {
        if (!isNewer(datagram.seq, last.seq)) continue;
        this.add(key, inflight - last.inflight, blocks - last.blocks);
        last.inflight = inflight;
        last.blocks = blocks;
        last.seq = datagram.seq;
      }
      changed.push(key);
    }
    return changed;
  }

  /** Forgets the senders not heard from since `before`; returns the keys whose sums changed. */
  expire(before: number): string[] {
    const changed = new Set<string>();
    for (const [id, sender] of this.senders) {
      if (sender.heardAt >= before) continue;
      for (const [key, last] of sender.keys) {
        this.add(key, -last.inflight, -last.blocks);
        changed.add(key);
      }
      this.senders.delete(id);
    }
    return [...changed];
  }

  private add(key: string, inflight: number, blocks: number): void {
    let totals = this.totals.get(key);
    if (totals === undefined) this.totals.set(key, (totals = { inflight: 0, blocks: 0 }));
    totals.inflight += inflight;
    totals.blocks += blocks;
    // Prefill is announced only for requests in flight; without any, the float sum's drift is set to 0.
    if (totals.inflight <= 0) {
      totals.inflight = 0;
      totals.blocks = 0;
    }
  }
}
