import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import type { KvEventType, KvGapOutcome, KvStreamListener } from '../../lib/exact-prefix/events/subscriber';
import { ephemeralStart } from '../helpers/ports';
import { sleep } from '../helpers/wait';

/** A fixture's bytes: hex pairs, `#` comments and whitespace ignored. */
export function fixture(name: string): Buffer {
  const text = readFileSync(join(__dirname, 'fixtures', name), 'utf8');
  return Buffer.from(text.replace(/#.*$/gm, '').replace(/\s+/g, ''), 'hex');
}

/** A KvStreamListener that records every call and wakes waiters on each. */
export class Recorder implements KvStreamListener {
  readonly events = new Map<string, number>();
  readonly gaps: Array<[number, KvGapOutcome]> = [];
  readonly freshness: Array<[number, boolean]> = [];
  readonly mismatches: Array<[number, number]> = [];
  readonly restarts: number[] = [];
  readonly disconnects: number[] = [];
  private waiters: Array<() => void> = [];

  event(rank: number, type: KvEventType, count: number): void {
    this.events.set(`${rank}:${type}`, this.count(rank, type) + count);
    this.wake();
  }
  gap(rank: number, outcome: KvGapOutcome): void {
    this.gaps.push([rank, outcome]);
    this.wake();
  }
  fresh(rank: number, fresh: boolean): void {
    this.freshness.push([rank, fresh]);
    this.wake();
  }
  rankMismatch(rank: number, reported: number): void {
    this.mismatches.push([rank, reported]);
    this.wake();
  }
  restart(rank: number): void {
    this.restarts.push(rank);
    this.wake();
  }

  disconnect(rank: number): void {
    this.disconnects.push(rank);
    this.wake();
  }

  count(rank: number, type: KvEventType): number {
    return this.events.get(`${rank}:${type}`) ?? 0;
  }

  /** Resolves once `condition` holds, checked after every listener call. */
  until(condition: () => boolean, what = 'condition', timeoutMs = 10_000): Promise<void> {
    if (condition()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), timeoutMs);
      const check = (): void => {
        if (condition()) {
          clearTimeout(timer);
          resolve();
        } else this.waiters.push(check);
      };
      this.waiters.push(check);
    });
  }

  private wake(): void {
    const waiting = this.waiters;
    this.waiters = [];
    for (const check of waiting) check();
  }
}

/**
 * Publishes `probe()` (an empty batch) until `ready()`: SUB sockets join asynchronously, and
 * what a PUB sends before the join is not delivered (ZeroMQ's "slow joiner").
 */
export async function untilJoined(probe: () => Promise<unknown>, ready: () => boolean): Promise<void> {
  for (let attempt = 0; attempt < 400 && !ready(); attempt++) {
    await probe();
    await sleep(25);
  }
  if (!ready()) throw new Error('the subscriber never joined');
}

/** A base port with `count` free ports after it on 127.0.0.1 (a probe; the caller retries on a race). */
export async function freePortRun(count: number): Promise<number> {
  // Below the ephemeral range, as helpers/ports.ts' freePort: a port listen(0) handed to another test file's server is not taken between the probe and the bind.
  const end = ephemeralStart() - count;
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 10_000 + Math.floor(Math.random() * (end - 10_000));
    if (await allFree(base, count)) return base;
  }
  throw new Error(`no run of ${count} free ports found`);
}

async function allFree(base: number, count: number): Promise<boolean> {
  for (let port = base; port < base + count; port++) {
    const free = await new Promise<boolean>((resolve) => {
      const server = createServer();
      server.once('error', () => resolve(false));
      server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
    });
    if (!free) return false;
  }
  return true;
}
