/** A binary min-heap of timed events; equal times pop in insertion order, keeping runs deterministic. */
export class EventQueue<T> {
  private readonly times: number[] = [];
  private readonly order: number[] = [];
  private readonly items: T[] = [];
  private inserted = 0;

  get size(): number {
    return this.items.length;
  }

  push(time: number, item: T): void {
    this.times.push(time);
    this.order.push(this.inserted++);
    this.items.push(item);
    let child = this.items.length - 1;
    while (child > 0) {
      const parent = (child - 1) >> 1;
      if (!this.before(child, parent)) break;
      this.swap(child, parent);
      child = parent;
    }
  }

  /** Removes the earliest event; returns its time and item. */
  pop(): { time: number; item: T } {
    const time = this.times[0];
    const item = this.items[0];
    const last = this.items.length - 1;
    this.swap(0, last);
    this.times.pop();
    this.order.pop();
    this.items.pop();
    let parent = 0;
    for (;;) {
      const left = parent * 2 + 1;
      const right = left + 1;
      let smallest = parent;
      if (left < this.items.length && this.before(left, smallest)) smallest = left;
      if (right < this.items.length && this.before(right, smallest)) smallest = right;
      if (smallest === parent) break;
      this.swap(parent, smallest);
      parent = smallest;
    }
    return { time, item };
  }

  private before(a: number, b: number): boolean {
    return this.times[a] < this.times[b] || (this.times[a] === this.times[b] && this.order[a] < this.order[b]);
  }

  private swap(a: number, b: number): void {
    [this.times[a], this.times[b]] = [this.times[b], this.times[a]];
    [this.order[a], this.order[b]] = [this.order[b], this.order[a]];
    [this.items[a], this.items[b]] = [this.items[b], this.items[a]];
  }
}
