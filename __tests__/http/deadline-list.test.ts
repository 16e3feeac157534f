import { afterEach, describe, expect, it } from '@jest/globals';
import { setTimeout as sleep } from 'node:timers/promises';
import { DeadlineList, type Deadlined } from '../../lib/http/deadline-list';

interface Item extends Deadlined {
  readonly name: string;
}

function item(name: string): Item {
  return { name, dueAt: 0, dueBefore: undefined, dueAfter: undefined, dueOn: undefined };
}

const lists: Array<DeadlineList<Item>> = [];
afterEach(() => {
  for (const list of lists.splice(0)) list.close();
});

/** A list whose expiries are recorded in order, with the time each came after its add. */
function recording(ms: number) {
  const expired: Array<{ name: string; afterMs: number }> = [];
  const added = new Map<string, number>();
  const list = new DeadlineList<Item>(ms, (gone) => expired.push({ name: gone.name, afterMs: performance.now() - added.get(gone.name)! }));
  lists.push(list);
  const add = (one: Item) => {
    added.set(one.name, performance.now());
    list.add(one);
  };
  return { list, expired, add };
}

describe('DeadlineList', () => {
  it('expires each item once, in the order added, no earlier than its duration', async () => {
    // 200 ms, adds 15 ms apart: on a loaded 2-core machine (jest's workers) a 15 ms sleep took over
    // 25, and with 40 ms the first item expired before the third was added.
    const { list, expired, add } = recording(200);
    const [a, b, c] = [item('a'), item('b'), item('c')];
    add(a);
    await sleep(15);
    add(b);
    await sleep(15);
    add(c);
    expect(list.size).toBe(3);
    await sleep(400);
    expect(expired.map((one) => one.name)).toEqual(['a', 'b', 'c']);
    // The event loop's millisecond clock may run up to 1 ms behind performance.now().
    for (const one of expired) expect(one.afterMs).toBeGreaterThanOrEqual(199);
    expect(list.size).toBe(0);
    expect(a.dueOn).toBeUndefined();
  });

  it('never expires an item removed before its time, at the head, in the middle or at the tail', async () => {
    const { list, expired, add } = recording(30);
    const items = ['a', 'b', 'c', 'd', 'e'].map(item);
    for (const one of items) add(one);
    list.remove(items[0]);
    list.remove(items[2]);
    list.remove(items[4]);
    expect(list.size).toBe(2);
    await sleep(90);
    expect(expired.map((one) => one.name)).toEqual(['b', 'd']);
  });

  it('ignores an item it does not hold, and moves one added again to the end with a new deadline', async () => {
    const { list, expired, add } = recording(50);
    const other = new DeadlineList<Item>(50, () => undefined);
    lists.push(other);
    const [a, b] = [item('a'), item('b')];
    add(a);
    add(b);
    other.remove(a);
    expect(list.size).toBe(2);
    await sleep(30);
    add(a);
    await sleep(35);
    // b is due (50 ms after its add); a was added again 35 ms ago.
    expect(expired.map((one) => one.name)).toEqual(['b']);
    await sleep(40);
    expect(expired.map((one) => one.name)).toEqual(['b', 'a']);
  });

  it('moves an item from another list onto itself', () => {
    const { list, add } = recording(1_000);
    const other = new DeadlineList<Item>(1_000, () => undefined);
    lists.push(other);
    const a = item('a');
    other.add(a);
    add(a);
    expect(other.size).toBe(0);
    expect(list.size).toBe(1);
  });

  it('sets its timer again for an item added after it ran empty', async () => {
    const { expired, add } = recording(20);
    const a = item('a');
    add(a);
    await sleep(60);
    expect(expired.map((one) => one.name)).toEqual(['a']);
    const b = item('b');
    add(b);
    await sleep(60);
    expect(expired.map((one) => one.name)).toEqual(['a', 'b']);
    expect(expired[1].afterMs).toBeGreaterThanOrEqual(19);
  });

  it('expires nothing once closed', async () => {
    const { list, expired, add } = recording(20);
    add(item('a'));
    list.close();
    await sleep(60);
    expect(expired).toEqual([]);
  });
});
