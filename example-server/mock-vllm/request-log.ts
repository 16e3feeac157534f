import type { MockRequestRecord } from './types';

const NO_HEADERS: readonly string[] = Object.freeze([]);
const RANK_HEADER = 'x-data-parallel-rank';

/** Every raw copy of `x-data-parallel-rank` (any letter case), in arrival order. */
export function rankHeaderCopies(rawHeaders: readonly string[]): readonly string[] {
  let copies: string[] | undefined;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i];
    if (name.length === RANK_HEADER.length && name.toLowerCase() === RANK_HEADER) {
      (copies ??= []).push(rawHeaders[i + 1]);
    }
  }
  return copies ?? NO_HEADERS;
}

/** The most recent requests in a fixed ring, so recording is O(1) however long the mock runs. */
export class RequestLog {
  private readonly ring: MockRequestRecord[] = [];
  private next = 0;

  constructor(private readonly capacity: number) {}

  /** Stores a record and returns it, so the caller can fill in the rank later. */
  add(method: string, path: string, rankHeaders: readonly string[]): MockRequestRecord {
    const record = { method, path, rankHeaders: rankHeaders as string[], rank: -1 };
    if (this.ring.length < this.capacity) this.ring.push(record);
    else this.ring[this.next] = record;
    this.next = (this.next + 1) % this.capacity;
    return record;
  }

  /** Copies, oldest first. */
  snapshot(): MockRequestRecord[] {
    const ordered =
      this.ring.length < this.capacity ? this.ring : [...this.ring.slice(this.next), ...this.ring.slice(0, this.next)];
    return ordered.map((record) => ({ ...record, rankHeaders: [...record.rankHeaders] }));
  }

  clear(): void {
    this.ring.length = 0;
    this.next = 0;
  }
}
