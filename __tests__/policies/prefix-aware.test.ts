import { describe, expect, it } from '@jest/globals';
import { OptionError, type PrefixAwareOptions } from '../../lib';
import { ExactPick } from '../../lib/policies/exact-pick';
import { BlockIndex, prefixAware, type PrefixPickContext } from '../../lib/policies/prefix-aware';
import type { Endpoint, PickContext, Policy } from '../../lib/types';

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

  it('weighs the uncached blocks against the queue ahead', () => {
    const policy = prefixAware();
    const candidates = endpoints(4);
    const long = text('doc', 12);
    const home = policy.pick(candidates, ctx(long)) as MutableEndpoint;
    // Hits teach the policy that a queued request costs little prefill.
    for (let i = 0; i < 100; i++) expect(policy.pick(candidates, ctx(long))).toBe(home);
    setLoad(home, 1); // one cheap request ahead costs less than 12 uncached blocks
    expect(policy.pick(candidates, ctx(long + text('next', 1)))).toBe(home);
    setLoad(home, 1000); // a long queue costs more than the whole prompt
    expect(policy.pick(candidates, ctx(long + text('next', 2)))).not.toBe(home);
  });

  it('searches the holder with the shortest queue first, and still finds a longer match behind a longer queue', () => {
    const policy = prefixAware({ contentBalance: 0 });
    const candidates = endpoints(2);
    const full = text('lead', 8) + text('tail', 92);
    const home = policy.pick(candidates, ctx(full)) as MutableEndpoint;
    const other = candidates.find((candidate) => candidate !== home)!;
    expect(policy.pick(candidates, ctx(full))).toBe(home); // a full hit: nothing of it waits
    setLoad(home, 1000);
    expect(policy.pick(candidates, ctx(text('lead', 8) + text('other', 92)))).toBe(other);
    // The other holds the lead and 8 blocks with an empty queue; home the whole prompt behind one
    // request (about a typical request's prefill, less than the 92 blocks the other lacks).
    setLoad(other, 0);
    setLoad(home, 1);
    expect(policy.pick(candidates, ctx(full))).toBe(home);
    expect(policy.matchedShare).toBe(1);
  });

  it('matches only leading blocks: a shared middle does not count', () => {
    const policy = prefixAware();
    const candidates = endpoints(2);
    const seen = text('head-1', 1) + text('body', 10);
    const other = text('head-2', 1) + text('body', 10);
    // Where a policy that saw nothing puts `other`, and the endpoint `seen` would otherwise get.
    const fresh = prefixAware().pick(candidates, ctx(other));
    const home = candidates.find((c) => c !== fresh) as MutableEndpoint;
    expect(policy.pick([home], ctx(seen))).toBe(home);
    setLoad(home, 1);
    // Same body behind a different first block: a miss, placed as if nothing were held.
    expect(policy.pick(candidates, ctx(other))).toBe(fresh);
  });

  it('places a new prefix by its rendezvous order: independent instances sharing the traffic agree', () => {
    for (const replicas of [2, 3]) {
      const policies = Array.from({ length: replicas }, () => prefixAware());
      const candidates = endpoints(8);
      const homes = new Map<number, Set<string>>();
      // 32 groups × 4 prompts, round-robin over the instances: each learns only from its share.
      for (let i = 0; i < 128; i++) {
        const group = (i * 7) % 32;
        const prompt = text(`system prompt ${group}`, 32) + text(`question ${i}`, 4);
        const home = policies[i % replicas].pick(candidates, ctx(prompt));
        homes.set(group, (homes.get(group) ?? new Set()).add(home.key));
      }
      for (const keys of homes.values()) expect(keys.size).toBe(1);
    }
  });

  it('spreads new prefixes over the endpoints as their hashes do', () => {
    const policy = prefixAware();
    const candidates = endpoints(8);
    const counts = new Map<string, number>();
    for (let i = 0; i < 800; i++) {
      const home = policy.pick(candidates, ctx(text(`prefix ${i}`, 8)));
      counts.set(home.key, (counts.get(home.key) ?? 0) + 1);
    }
    expect(counts.size).toBe(8);
    for (const count of counts.values()) expect(count).toBeGreaterThan(60); // mean 100
  });

  it('places by the lead: prompts sharing their first 4 blocks go together, whatever follows', () => {
    const a = prefixAware();
    const b = prefixAware();
    const candidates = endpoints(8);
    for (let i = 0; i < 5; i++) b.pick(candidates, ctx(text(`other ${i}`, 8))); // a history `a` lacks
    const lead = text('shared lead', 4);
    const home = a.pick(candidates, ctx(lead + text('tail a', 6)));
    // `b` never saw the lead and places it alike; `a` matches it.
    expect(b.pick(candidates, ctx(lead + text('tail b', 9)))).toBe(home);
    expect(a.pick(candidates, ctx(lead + text('tail c', 2)))).toBe(home);
  });

  it('bounds a new prefix by load, spilling along the same order in every instance', () => {
    const candidates = endpoints(8);
    const prompts = Array.from({ length: 16 }, (_, i) => text(`hot ${i}`, 12));
    for (const prompt of prompts) {
      const first = prefixAware().pick(candidates, ctx(prompt)) as MutableEndpoint;
      // The mean load is 1.25, the least 0: the bound is max(⌈1.25 × 1.25⌉, 0 + 4) = 4.
      setLoad(first, 10);
      const spills = [prefixAware(), prefixAware()].map((policy) => policy.pick(candidates, ctx(prompt)));
      expect(spills[0]).not.toBe(first);
      expect(spills[1]).toBe(spills[0]);
      setLoad(first, 4); // within the bound: stays
      expect(prefixAware().pick(candidates, ctx(prompt))).toBe(first);
      setLoad(first, 0);
    }
  });

  it("prices the prefill other replicas announce (peers) as known work, not their requests as unknown load", () => {
    const candidates = endpoints(8) as Array<MutableEndpoint & { peerInflight: number; peerBlocks: number }>;
    for (const endpoint of candidates) Object.assign(endpoint, { peerInflight: 0, peerBlocks: 0 });
    const prompt = text('announced', 12);
    const first = prefixAware().pick(candidates, ctx(prompt)) as (typeof candidates)[number];
    // One peer request there, in `load`: 12 blocks for its slot (a typical request, the prompt's
    // own 12 before anything is learned) plus its announced prefill, against a slack of 4 × 12.
    // Priced as unknown load as well, it would cost 12 more (54 > 48) and move the prompt.
    Object.assign(first, { load: 1, peerInflight: 1, peerBlocks: 30 });
    expect(prefixAware().pick(candidates, ctx(prompt))).toBe(first);
    // The announced prefill counts: 37 + 12 > 48.
    Object.assign(first, { peerBlocks: 37 });
    expect(prefixAware().pick(candidates, ctx(prompt))).not.toBe(first);
    Object.assign(first, { peerInflight: 0, peerBlocks: 0 });
    // The same load, not announced: priced at a typical request's prefill (12 + 12 ≤ 48).
    expect(prefixAware().pick(candidates, ctx(prompt))).toBe(first);
  });

  it('spreads a hot new prefix once its first choice is loaded', () => {
    const policy = prefixAware();
    const candidates = endpoints(8);
    const system = text('hot system', 32);
    const homes = new Set<string>();
    // Requests never finish: each pick adds to its endpoint's load.
    for (let i = 0; i < 64; i++) {
      const home = policy.pick(candidates, ctx(system + text(`question ${i}`, 4))) as MutableEndpoint;
      setLoad(home, home.load + 1);
      homes.add(home.key);
    }
    expect(homes.size).toBeGreaterThan(1);
    expect(Math.max(...candidates.map((c) => c.load))).toBeLessThan(64);
  });

  it('does not draw every new conversation onto the holder of a short shared system prompt', () => {
    const system = text('system', 4);
    const firstTurns = Array.from({ length: 8 }, (_, i) => system + text(`user ${i}`, 12));
    const spread = (contentBalance: number): { homes: Endpoint[]; most: number } => {
      const policy = prefixAware({ contentBalance });
      const candidates = endpoints(8);
      const homes = firstTurns.map((prompt) => policy.pick(candidates, ctx(prompt)));
      const counts = new Map<string, number>();
      for (const home of homes) counts.set(home.key, (counts.get(home.key) ?? 0) + 1);
      // Each conversation's next turn goes back to its own endpoint.
      firstTurns.forEach((prompt, i) => expect(policy.pick(candidates, ctx(prompt + text(`reply ${i}`, 4)))).toBe(homes[i]));
      return { homes, most: Math.max(...counts.values()) };
    };
    expect(spread(1).most).toBeLessThanOrEqual(2);
    expect(spread(0).most).toBe(8); // without the term, the cache saving alone wins
  });

  it('balances content on the engines\' events where a shared prefix is on two ranks or more, not where one rank holds it', () => {
    const system = text('system', 4);
    const prompts = Array.from({ length: 8 }, (_, i) => system + text(`user ${i}`, 12));
    /** Picks each prompt with the events showing the system prompt on `holders` (and on every rank chosen since). */
    const homesWith = (holders: number[]): Set<string> => {
      const policy = prefixAware();
      const candidates = endpoints(8);
      const holding = new Set(holders);
      const homes = new Set<string>();
      for (const prompt of prompts) {
        const matched = Int32Array.from(candidates, (_, rank) => (holding.has(rank) ? 4 : 0));
        const exactCtx: PrefixPickContext = { ...ctx(prompt), exact: new ExactPick(16, matched) };
        const home = policy.pick(candidates, exactCtx);
        holding.add(home.rank);
        homes.add(home.key);
      }
      return homes;
    };
    // Two holders: the content term moves new conversations on as their new blocks pile up.
    expect(homesWith([0, 1]).size).toBeGreaterThanOrEqual(6);
    // One holder of the longest prefix: the prompts stay with its cache.
    const history = text('history', 12);
    const policy = prefixAware();
    const candidates = endpoints(8);
    const matched = Int32Array.from(candidates, (_, rank) => (rank === 3 ? 12 : 0));
    for (let i = 0; i < 8; i++) {
      const exactCtx: PrefixPickContext = { ...ctx(history + text(`turn ${i}`, 4)), exact: new ExactPick(16, matched) };
      expect(policy.pick(candidates, exactCtx)).toBe(candidates[3]);
    }
  });

  it('spreads ties between the ranks the events show holding a prefix, and keeps spills of one prefix together', () => {
    const system = text('system', 4);
    const prompts = Array.from({ length: 8 }, (_, i) => system + text(`user ${i}`, 12));
    const homesWith = (matched: Int32Array): Set<number> => {
      const policy = prefixAware({ contentBalance: 0 });
      const candidates = endpoints(8);
      return new Set(prompts.map((prompt) => policy.pick(candidates, { ...ctx(prompt), exact: new ExactPick(16, matched) } as PrefixPickContext).rank));
    };
    // Ranks 0 and 1 hold the system prompt: the prompts that extend it go to both.
    expect(homesWith(Int32Array.from({ length: 8 }, (_, rank) => (rank < 2 ? 4 : 0)))).toEqual(new Set([0, 1]));
    // Rank 0 holds it but is busy: the prompts that leave it all go to one other rank.
    const policy = prefixAware({ contentBalance: 0 });
    const candidates = endpoints(8);
    setLoad(candidates[0], 64);
    const matched = Int32Array.from({ length: 8 }, (_, rank) => (rank === 0 ? 4 : 0));
    const spills = new Set(prompts.map((prompt) => policy.pick(candidates, { ...ctx(prompt), exact: new ExactPick(16, matched) } as PrefixPickContext).rank));
    expect(spills.size).toBe(1);
    expect(spills.has(0)).toBe(false);
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
    const prompt = text('gone', 8);
    const [home, a, b] = ((): MutableEndpoint[] => {
      const all = endpoints(3);
      const first = prefixAware().pick(all, ctx(prompt)) as MutableEndpoint;
      return [first, ...all.filter((c) => c !== first)];
    })();
    const route = (fillers: number): string => {
      const policy = prefixAware();
      setLoad(home, 0);
      const answered = home as MutableEndpoint & { firstTokens?: number };
      answered.firstTokens = 0;
      expect(policy.pick([home, a, b], ctx(prompt))).toBe(home);
      // Its first token came: that request no longer waits for prefill.
      answered.firstTokens = 1;
      for (let i = 0; i < fillers; i++) policy.pick([a, b], ctx(text(`filler ${i}`, 1)));
      policy.pick([a], ctx(text('gone', 4))); // `a` holds the first half
      // Two cheap requests ahead cost less than 4 uncached blocks; 8 cost more than that.
      setLoad(home, 2);
      return policy.pick([home, a, b], ctx(prompt)).key;
    };
    // Remembered, `home` holds the whole prompt and wins despite its queue; forgotten, `a` does.
    expect(route(100)).toBe(home.key);
    expect(route(9000)).toBe(a.key);
  });

  it('rejects invalid options', () => {
    expect(() => prefixAware({ blockChars: 0 })).toThrow(/blockChars/);
    expect(() => prefixAware({ maxBlocksPerEndpoint: 1.5 })).toThrow(TypeError);
    expect(() => prefixAware({ contentBalance: -1 })).toThrow(/contentBalance/);
  });

  it("checks its options by the router's `prefixAware` rules, with the one OptionError", () => {
    expect(() => prefixAware({ blockChars: 0 })).toThrow(OptionError);
    expect(() => prefixAware({ blockChars: 0 })).toThrow('express-dp-router: `prefixAware.blockChars` must be an integer from 1 to 1048576, got 0. Use e.g. `prefixAware.blockChars: 64`.');
    expect(() => prefixAware({ blockChar: 64 } as PrefixAwareOptions)).toThrow(/`prefixAware\.blockChar` is not an option\. Did you mean `blockChars`\?/);
    expect(() => prefixAware({ fallback: {} as Policy })).toThrow(/`prefixAware\.fallback` must be a policy object/);
  });
});

describe('BlockIndex', () => {
  const hashes = (from: number, count: number) => Int32Array.from({ length: count }, (_, i) => from + i);

  it('holds the most recent maxBlocks blocks, never more than twice that', () => {
    const index = new BlockIndex(1000);
    let largest = 0;
    let recentMissing = 0;
    for (let start = 1; start < 100_000; start += 50) {
      expect(index.record(hashes(start, 50), 50)).toBe(50);
      largest = Math.max(largest, index.size);
      const newest = start + 49;
      for (let hash = Math.max(1, newest - 999); hash <= newest; hash++) if (!index.has(hash)) recentMissing++;
    }
    expect(largest).toBeLessThanOrEqual(2000);
    expect(largest).toBeGreaterThan(1900);
    expect(recentMissing).toBe(0);
    expect(index.size).toBeGreaterThanOrEqual(1000);
    expect(index.has(1)).toBe(false);
    expect(index.bytes).toBe(2 * 4 * 2048);
    expect(index.record(hashes(99_951, 50), 50)).toBe(0); // all held: nothing new
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
    const index = new BlockIndex(50);
    const chain = hashes(1, 40);
    index.record(chain, 40);
    index.record(hashes(1000, 30), 30); // rotates a generation partway
    for (let run = index.leadingRun(chain, 40, 0), i = 0; i < run; i++) expect(index.has(chain[i])).toBe(true);
    expect(index.has(chain[0])).toBe(true);
  });
});
