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

/** Which of a sender's datagrams were seen: the highest counter, and a bit for each of the {@link WINDOW} below and at it. */
interface SeenWindow {
  highest: number;
  seen: number;
}

interface Sender extends SeenWindow {
  heardAt: number;
  readonly keys: Map<string, Announced>;
}

/** A sender forgotten by {@link PeerTable.expire}: its highest counter is kept until `until`, so that its old datagrams stay refused. */
interface Retired {
  readonly highest: number;
  readonly until: number;
}

/** More senders than a deployment has replicas: past it, new ones are ignored until some expire. */
const MAX_SENDERS = 256;
/** More endpoints than one router routes to. */
const MAX_KEYS_PER_SENDER = 4_096;

/**
 * Datagrams a sender may have sent after the one that arrives, and still be taken: reordering on
 * the way (RFC 4303's anti-replay window, §3.4.3). An older one is refused as a replay.
 */
const WINDOW = 32;

/**
 * Takes `seq` into `window` and says whether it is new: ahead of the highest seen, or within
 * {@link WINDOW} below it and not seen yet. Anything else was seen, or is too old to tell.
 */
function admit(window: SeenWindow, seq: number): boolean {
  const ahead = (seq - window.highest) >>> 0;
  if (ahead !== 0 && ahead < 0x80000000) {
    window.seen = ahead >= WINDOW ? 1 : ((window.seen << ahead) | 1) >>> 0;
    window.highest = seq;
    return true;
  }
  const behind = (window.highest - seq) >>> 0;
  if (behind >= WINDOW) return false;
  const bit = (1 << behind) >>> 0;
  if ((window.seen & bit) !== 0) return false;
  window.seen = (window.seen | bit) >>> 0;
  return true;
}

/** Whether `seq` comes after `last` in a 32-bit counter that wraps. */
function isNewer(seq: number, last: number): boolean {
  const ahead = (seq - last) >>> 0;
  return ahead !== 0 && ahead < 0x80000000;
}

/**
 * What every peer announced last, per endpoint key, and the sums over peers, pure: the link
 * applies datagrams to it and copies the sums of the keys that changed onto its endpoints. A
 * datagram seen before, or older than the last {@link WINDOW} of its sender, is refused, also
 * for `retainMs` after the sender was forgotten: a captured datagram replayed after each
 * `ttlMs` would otherwise keep a stopped replica's load counted (the link refuses it by its
 * signed time after that). Its memory is bounded by {@link MAX_SENDERS} ×
 * {@link MAX_KEYS_PER_SENDER}, and as many retired windows, whatever arrives.
 */
export class PeerTable {
  private readonly senders = new Map<number, Sender>();
  private readonly retired = new Map<number, Retired>();
  private readonly totals = new Map<string, PeerTotals>();

  /**
   * @param self this replica's own sender id, whose datagrams are ignored.
   * @param retainMs how long a forgotten sender's window is kept.
   */
  constructor(
    private readonly self: number,
    private readonly retainMs = 0,
  ) {}

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

  /**
   * Applies a datagram heard at `now`; returns the keys whose sums changed (none for this
   * replica's own), or `'replayed'` for a datagram of its sender seen before or too old to tell.
   */
  apply(datagram: PeerDatagram, now: number): string[] | 'replayed' {
    if (datagram.sender === this.self) return [];
    let sender = this.senders.get(datagram.sender);
    if (sender === undefined) {
      if (this.senders.size >= MAX_SENDERS) return [];
      const retired = this.retired.get(datagram.sender);
      // A forgotten sender counts again only with a datagram newer than all it sent before: an
      // older one, even unseen, would be as stale as the load it carries.
      if (retired !== undefined && retired.until > now && !isNewer(datagram.seq, retired.highest)) return 'replayed';
      const window: SeenWindow = { highest: (datagram.seq - 1) >>> 0, seen: 0 };
      admit(window, datagram.seq);
      // Heard again (a partition healed): counted afresh from this datagram on.
      this.retired.delete(datagram.sender);
      sender = { heardAt: now, keys: new Map(), highest: window.highest, seen: window.seen };
      this.senders.set(datagram.sender, sender);
    } else if (!admit(sender, datagram.seq)) {
      return 'replayed';
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

  /**
   * Forgets the senders not heard from since `before` (their windows kept `retainMs` from `now`);
   * returns the keys whose sums changed.
   */
  expire(before: number, now = before): string[] {
    const changed = new Set<string>();
    for (const [id, retired] of this.retired) if (retired.until <= now) this.retired.delete(id);
    for (const [id, sender] of this.senders) {
      if (sender.heardAt >= before) continue;
      for (const [key, last] of sender.keys) {
        this.add(key, -last.inflight, -last.blocks);
        changed.add(key);
      }
      this.senders.delete(id);
      if (this.retainMs <= 0) continue;
      // The oldest retired window goes first; past that, the signed time alone refuses its datagrams.
      if (this.retired.size >= MAX_SENDERS) this.retired.delete(this.retired.keys().next().value!);
      this.retired.set(id, { highest: sender.highest, until: now + this.retainMs });
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
