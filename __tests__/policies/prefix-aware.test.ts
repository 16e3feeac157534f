import { describe, expect, it } from '@jest/globals';
import { BlockIndex, prefixAware } from '../../lib/policies/prefix-aware';
import type { Endpoint, PickContext } from '../../lib/types';

type MutableEndpoint = { -readonly [K in keyof Endpoint]: Endpoint[K] };

function endpoints(count: number): MutableEndpoint[] {
  return Array.from({ length: count }, (_, rank) => ({
    key: `gpu#${rank}`,
    upstream: 'gpu',
    rank,
    inflight: 0,
    load: 0,
    healthy: true,
  }));
}

function setLoad(endpoint: MutableEndpoint, load: number): void {
  endpoint.load = load;
  endpoint.inflight = load;
}

const ctx = (prompt: string | undefined): PickContext => ({ path: '/v1/completions', affinityKey: undefined, prompt });
/** Deterministic text of `blocks` 64-character blocks, distinct per seed. */
const text = (seed: string, blocks: number): string => `${seed}:`.padEnd(64, '.').repeat(blocks);

describe('prefixAware', () => {
  it('asks the router for the prompt', () => {
    expect(prefixAware()).toMatchObject({ name: 'prefix-aware', usesPrompt: true });
  });

  it('sends a repeated prefix back to the endpoint that saw it', () => {
    const policy = prefixAware();
    const candidates = endpoints(8);
    const system = text('system A', 20);
    const first = policy.pick(candidates, ctx(system + 'question 1'.padEnd(128, '?')));
    for (let i = 2; i < 10; i++) {
      expect(policy.pick(candidates, ctx(system + `question ${i}`.padEnd(128, '?')))).toBe(first);
    }
  });

  it('prefers the longest leading run of matching blocks over a lighter load', () => {
    const policy = prefixAware();
    const candidates = endpoints(4);
    const short = text('doc', 4);
    const long = short + text('chapter', 8);
    const holdsShort = policy.pick(candidates, ctx(short));
    setLoad(holdsShort as MutableEndpoint, 5); // too busy: the long prompt goes elsewhere
    const holdsLong = policy.pick(candidates, ctx(long));
    expect(holdsLong).not.toBe(holdsShort);
    setLoad(holdsShort as MutableEndpoint, 0);
    setLoad(holdsLong as MutableEndpoint, 1); // busier, but within the imbalance margins
    expect(policy.pick(candidates, ctx(long + text('next', 2)))).toBe(holdsLong);
  });

  it('matches only leading blocks: a shared middle does not count', () => {
    const policy = prefixAware();
    const candidates = endpoints(2);
    const home = policy.pick(candidates, ctx(text('head-1', 1) + text('body', 10)));
    setLoad(candidates[home.rank], 1);
    // Same body behind a different first block: no match, so the least loaded wins.
    expect(policy.pick(candidates, ctx(text('head-2', 1) + text('body', 10)))).not.toBe(home);
  });

  it('falls back to least-outstanding when the matching endpoint is imbalanced', () => {
    const policy = prefixAware({ imbalanceAbsolute: 2, imbalanceRelative: 1.5 });
    const candidates = endpoints(4);
    const prompt = text('shared', 16);
    const home = policy.pick(candidates, ctx(prompt));
    candidates.forEach((e) => setLoad(e, 4));
    setLoad(home as MutableEndpoint, 6); // 6 − 4 = 2: not above the absolute margin
    expect(policy.pick(candidates, ctx(prompt))).toBe(home);
    setLoad(home as MutableEndpoint, 7); // above 4 + 2 and above 4 × 1.5
    const moved = policy.pick(candidates, ctx(prompt));
    expect(moved).not.toBe(home);
    setLoad(home as MutableEndpoint, 4);
    setLoad(moved as MutableEndpoint, 4);
    // Both now hold the prefix: equal matches go to the less loaded.
    setLoad(home as MutableEndpoint, 5);
    expect(policy.pick(candidates, ctx(prompt))).toBe(moved);
  });

  it('uses the fallback without a prompt or with less than one block', () => {
    const picks: number[] = [];
    const policy = prefixAware({
      fallback: {
        name: 'spy',
        pick(candidates) {
          picks.push(1);
          return candidates[2];
        },
      },
    });
    const candidates = endpoints(4);
    expect(policy.pick(candidates, ctx(undefined))).toBe(candidates[2]);
    expect(policy.pick(candidates, ctx('short'))).toBe(candidates[2]);
    expect(picks).toHaveLength(2);
  });

  it('keys state by endpoint key, not object identity', () => {
    const policy = prefixAware();
    const prompt = text('stable', 8);
    const home = policy.pick(endpoints(6), ctx(prompt));
    const rebuilt = endpoints(6).reverse();
    expect(policy.pick(rebuilt, ctx(prompt)).key).toBe(home.key);
  });

  it('forgets the index of an endpoint that stops being a candidate', () => {
    const policy = prefixAware();
    const all = endpoints(2);
    const prompt = text('gone', 8);
    const home = policy.pick(all, ctx(prompt));
    const others = all.filter((e) => e !== home);
    for (let i = 0; i < 9000; i++) policy.pick(others, ctx(text(`filler ${i}`, 1)));
    // Remembered, `home` would win at load 1 (within the margins); forgotten, the idle one does.
    setLoad(home as MutableEndpoint, 1);
    expect(policy.pick(all, ctx(prompt))).toBe(others[0]);
  });

  it('rejects invalid options', () => {
    expect(() => prefixAware({ blockChars: 0 })).toThrow(/blockChars/);
    expect(() => prefixAware({ maxBlocksPerEndpoint: 1.5 })).toThrow(TypeError);
    expect(() => prefixAware({ imbalanceAbsolute: -1 })).toThrow(/imbalanceAbsolute/);
  });
});

describe('BlockIndex', () => {
  const hashes = (from: number, count: number) => Int32Array.from({ length: count }, (_, i) => from + i);

  it('never holds more than its bound and keeps the most recent blocks', () => {
    const index = new BlockIndex(1000);
    for (let start = 1; start < 100_000; start += 50) {
      index.record(hashes(start, 50), 50);
      expect(index.size).toBeLessThanOrEqual(1000);
    }
    expect(index.size).toBeGreaterThanOrEqual(500);
    expect(index.has(99_951)).toBe(true);
    expect(index.has(1)).toBe(false);
    expect(index.bytes).toBe(2 * 4 * 1024);
  });

  it('finds the leading run by binary search over a prefix-closed chain', () => {
    const index = new BlockIndex(1000);
    index.record(hashes(10, 40), 40);
    expect(index.leadingRun(hashes(10, 64), 64, 0)).toBe(40);
    expect(index.leadingRun(hashes(11, 64), 64, 0)).toBe(39);
    expect(index.leadingRun(hashes(500, 8), 8, 0)).toBe(0);
    expect(index.leadingRun(hashes(10, 64), 64, 41)).toBe(0);
    expect(index.leadingRun(hashes(10, 64), 64, 40)).toBe(40);
  });

  it('evicts a chain from its tail: the head outlives it', () => {
    const index = new BlockIndex(100);
    const chain = hashes(1, 40);
    index.record(chain, 40);
    index.record(hashes(1000, 30), 30); // rotates a generation partway
    for (let run = index.leadingRun(chain, 40, 0), i = 0; i < run; i++) expect(index.has(chain[i])).toBe(true);
    expect(index.has(chain[0])).toBe(true);
  });
});
