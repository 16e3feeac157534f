/**
 * The waiting room, as pure logic: priority classes, and inside each class a round-robin ring
 * of tenants with one FIFO per tenant, earliest deadline first (requests with a TTFT objective,
 * `slo`: arrival + objective; the others have none and keep their order behind them). Every
 * operation but an enqueue with a deadline is O(1) (the class scan is bounded by
 * the number of configured classes): enqueue, remove (a client that left, a timeout) and
 * dequeue. A tenant with nothing waiting is dropped at once, so memory follows what waits,
 * never how many tenants were ever seen.
 */

/** One waiting entry; the queue links it in place (no allocation besides the entry itself). */
export class Waiter<T> {
  /** The tenant FIFO holding it; `undefined` once it left the queue. */
  lane: Lane<T> | undefined = undefined;
  prev: Waiter<T> | undefined = undefined;
  next: Waiter<T> | undefined = undefined;

  constructor(
    readonly value: T,
    readonly tenant: string,
    /** Index into the configured classes, 0 the highest. */
    readonly priority: number,
    /** Arrival order across the whole queue, for ties between queues. */
    readonly seq: number,
    /** When it must start to meet its objective (`performance.now()` ms); Infinity for none. */
    readonly deadline: number = Infinity,
  ) {}

  /** Whether it still waits. */
  get waiting(): boolean {
    return this.lane !== undefined;
  }
}

/** One tenant's FIFO inside one class, linked into that class's ring. */
class Lane<T> {
  head: Waiter<T> | undefined = undefined;
  tail: Waiter<T> | undefined = undefined;
  size = 0;
  prev: Lane<T> = this;
  next: Lane<T> = this;
  constructor(
    readonly tenant: string,
    readonly level: Level<T>,
  ) {}
}

/** One priority class: its tenants' lanes by name, and the ring's cursor (whose turn is next). */
class Level<T> {
  readonly lanes = new Map<string, Lane<T>>();
  cursor: Lane<T> | undefined = undefined;
  size = 0;
  /** Releases given to higher classes since this one was last served while it had waiters. */
  passedOver = 0;
}

/**
 * Priority classes with fair tenants. A higher class is served first, but a class with waiters
 * is passed over at most `starvationLimit` times in a row: the next release then goes to it
 * (the highest such class first), so a lower class gets at least one release in every
 * `starvationLimit + 1` while it waits.
 */
export class FairQueue<T> {
  private readonly levels: Level<T>[];
  private readonly perTenant = new Map<string, number>();
  private seq = 0;
  size = 0;

  constructor(
    classes: number,
    private readonly starvationLimit: number,
  ) {
    this.levels = Array.from({ length: classes }, () => new Level<T>());
  }

  /** Waiting entries of one class. */
  depth(priority: number): number {
    return this.levels[priority].size;
  }

  /** Waiting entries of one tenant, across classes. */
  tenantSize(tenant: string): number {
    return this.perTenant.get(tenant) ?? 0;
  }

  /** How many tenants have something waiting. */
  get tenants(): number {
    return this.perTenant.size;
  }

  /**
   * Adds to the tenant's FIFO in its class, ahead of its entries with a later deadline (a walk
   * from the tail, over those only: the tenant's own, at most `maxPerTenant`); a new tenant joins
   * the ring just before the cursor (last in this round). Deadlines order a tenant's requests,
   * not the tenants: a caller with tight objectives does not jump over other tenants' turns.
   */
  push(value: T, tenant: string, priority: number, seq = this.seq++, deadline = Infinity): Waiter<T> {
    const waiter = new Waiter(value, tenant, priority, seq, deadline);
    const level = this.levels[priority];
    let lane = level.lanes.get(tenant);
    if (lane === undefined) {
      lane = new Lane(tenant, level);
      level.lanes.set(tenant, lane);
      const cursor = level.cursor;
      if (cursor === undefined) {
        level.cursor = lane;
      } else {
        lane.prev = cursor.prev;
        lane.next = cursor;
        cursor.prev.next = lane;
        cursor.prev = lane;
      }
    }
    waiter.lane = lane;
    let after = lane.tail;
    while (after !== undefined && after.deadline > deadline) after = after.prev;
    waiter.prev = after;
    waiter.next = after === undefined ? lane.head : after.next;
    if (after === undefined) lane.head = waiter;
    else after.next = waiter;
    if (waiter.next === undefined) lane.tail = waiter;
    else waiter.next.prev = waiter;
    lane.size++;
    level.size++;
    this.size++;
    this.perTenant.set(tenant, (this.perTenant.get(tenant) ?? 0) + 1);
    return waiter;
  }

  /** The entry {@link shift} would return, without taking it. */
  peek(): Waiter<T> | undefined {
    const level = this.nextLevel();
    return level?.cursor?.head;
  }

  /** Takes the next entry: the chosen class's tenant whose turn it is, its oldest entry; that tenant's turn passes. */
  shift(): Waiter<T> | undefined {
    const waiter = this.peek();
    if (waiter !== undefined) this.take(waiter);
    return waiter;
  }

  /**
   * The first entry, in the order {@link shift} would serve them, that `accepts` takes: the class
   * to serve, then the others highest first; in a class, the tenants from the one whose turn it
   * is, each tenant's entries oldest first. The head itself when it is taken (one call).
   */
  first(accepts: (value: T) => boolean): Waiter<T> | undefined {
    const served = this.nextLevel();
    if (served === undefined) return undefined;
    const found = firstIn(served, accepts);
    if (found !== undefined) return found;
    for (const level of this.levels) {
      if (level === served || level.size === 0) continue;
      const other = firstIn(level, accepts);
      if (other !== undefined) return other;
    }
    return undefined;
  }

  /**
   * Takes `waiter`, which {@link peek} or {@link first} returned, as its turn: its tenant's turn
   * passes (a tenant served ahead of its turn goes to the end of the round, so the ones passed
   * over keep theirs) and the classes below count one more pass-over.
   */
  take(waiter: Waiter<T>): void {
    const lane = waiter.lane!;
    const level = lane.level;
    let below = false;
    for (const other of this.levels) {
      if (other === level) {
        below = true;
        other.passedOver = 0;
      } else if (below && other.size > 0) {
        other.passedOver++;
      }
    }
    const cursor = level.cursor!;
    if (cursor === lane) {
      level.cursor = lane.next;
    } else if (cursor.prev !== lane) {
      lane.prev.next = lane.next;
      lane.next.prev = lane.prev;
      lane.prev = cursor.prev;
      lane.next = cursor;
      cursor.prev.next = lane;
      cursor.prev = lane;
    }
    this.remove(waiter);
  }

  /** Takes `waiter` out wherever it stands (a client that left, a timeout); false when it was gone already. */
  remove(waiter: Waiter<T>): boolean {
    const lane = waiter.lane;
    if (lane === undefined) return false;
    if (waiter.prev === undefined) lane.head = waiter.next;
    else waiter.prev.next = waiter.next;
    if (waiter.next === undefined) lane.tail = waiter.prev;
    else waiter.next.prev = waiter.prev;
    waiter.lane = waiter.prev = waiter.next = undefined;
    lane.size--;
    const level = lane.level;
    level.size--;
    this.size--;
    const left = this.perTenant.get(waiter.tenant)! - 1;
    if (left === 0) this.perTenant.delete(waiter.tenant);
    else this.perTenant.set(waiter.tenant, left);
    if (lane.size === 0) this.dropLane(lane);
    return true;
  }

  private dropLane(lane: Lane<T>): void {
    const level = lane.level;
    level.lanes.delete(lane.tenant);
    if (lane.next === lane) {
      level.cursor = undefined;
    } else {
      if (level.cursor === lane) level.cursor = lane.next;
      lane.prev.next = lane.next;
      lane.next.prev = lane.prev;
    }
    lane.prev = lane.next = lane;
  }

  /** The class to serve: the highest passed over `starvationLimit` times, else the highest with waiters. */
  private nextLevel(): Level<T> | undefined {
    let first: Level<T> | undefined;
    for (const level of this.levels) {
      if (level.size === 0) continue;
      if (level.passedOver >= this.starvationLimit) return level;
      first ??= level;
    }
    return first;
  }
}

/** The first entry of one class that `accepts` takes, from the tenant whose turn it is. */
function firstIn<T>(level: Level<T>, accepts: (value: T) => boolean): Waiter<T> | undefined {
  const start = level.cursor!;
  let lane = start;
  do {
    for (let waiter = lane.head; waiter !== undefined; waiter = waiter.next) if (accepts(waiter.value)) return waiter;
    lane = lane.next;
  } while (lane !== start);
  return undefined;
}
