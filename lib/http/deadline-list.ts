/** An item a {@link DeadlineList} can hold: the list's links are the item's own fields, so holding one allocates nothing. */
export interface Deadlined {
  /** When it expires, by `performance.now()`. */
  dueAt: number;
  dueBefore: Deadlined | undefined;
  dueAfter: Deadlined | undefined;
  /** The list it is on, if any. */
  dueOn: DeadlineList<Deadlined> | undefined;
}

/**
 * Deadlines of one duration on one timer. With one duration, deadlines fall in the order the
 * items were added, so the list is first in, first out, and only its head needs a timer: the
 * timer is set for the head and, when it fires, expires what is due and is set again for the
 * new head. An item removed before its time (the usual case) costs two links. (A `setTimeout`
 * per upstream try cost about 2,300 instructions and a timer object that scavenges copied; Node's
 * HTTP server checks its request timeouts on one timer for the same reason.)
 *
 * The timer does not keep the process alive: whatever is waiting on a deadline (a socket) does.
 */
export class DeadlineList<T extends Deadlined> {
  private first: T | undefined = undefined;
  private last: T | undefined = undefined;
  private timer: NodeJS.Timeout | undefined = undefined;
  private readonly fire = () => this.expireDue();

  /**
   * @param ms how long after {@link add} an item expires
   * @param expire called once for each item that expires, after it left the list
   */
  constructor(
    private readonly ms: number,
    private readonly expire: (item: T) => void,
  ) {}

  /** Puts `item` on the list, due `ms` from now; an item already on a list is moved. */
  add(item: T): void {
    item.dueOn?.remove(item);
    item.dueAt = performance.now() + this.ms;
    item.dueBefore = this.last;
    item.dueAfter = undefined;
    item.dueOn = this as unknown as DeadlineList<Deadlined>;
    if (this.last === undefined) this.first = item;
    else this.last.dueAfter = item;
    this.last = item;
    // A timer set already is for an earlier deadline: it sets itself again when it fires.
    if (this.timer === undefined) this.arm(this.ms);
  }

  /** Takes `item` off the list; nothing when it is not on it. */
  remove(item: T): void {
    if (item.dueOn !== (this as unknown as DeadlineList<Deadlined>)) return;
    const before = item.dueBefore as T | undefined;
    const after = item.dueAfter as T | undefined;
    if (before === undefined) this.first = after;
    else before.dueAfter = after;
    if (after === undefined) this.last = before;
    else after.dueBefore = before;
    item.dueBefore = item.dueAfter = item.dueOn = undefined;
  }

  /** How many items are on the list (walks it: for tests and diagnostics). */
  get size(): number {
    let count = 0;
    for (let item = this.first; item !== undefined; item = item.dueAfter as T | undefined) count++;
    return count;
  }

  /** Stops the timer; items left on the list never expire. */
  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private arm(delay: number): void {
    this.timer = setTimeout(this.fire, delay);
    this.timer.unref();
  }

  private expireDue(): void {
    this.timer = undefined;
    // Timers run on the event loop's millisecond clock, which may be up to 1 ms behind.
    const now = performance.now() + 1;
    let item = this.first;
    while (item !== undefined && item.dueAt <= now) {
      this.remove(item);
      this.expire(item);
      item = this.first;
    }
    if (item !== undefined) this.arm(Math.max(1, item.dueAt - performance.now()));
  }
}
