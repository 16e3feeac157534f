import { describe, expect, it } from '@jest/globals';
import { sessionAffinity } from '../../lib/policies/session-affinity';
import type { Endpoint, PickContext, Policy } from '../../lib/types';

function endpoints(count: number, load = 0): Endpoint[] {
  return Array.from({ length: count }, (_, rank) => ({
    key: `http://gpu:8000#${rank}`,
    upstream: 'http://gpu:8000',
    rank,
    inflight: load,
    load,
    healthy: true,
  }));
}

const ctx = (affinityKey: string | undefined): PickContext => ({ path: '/v1/chat/completions', affinityKey, prompt: undefined });
const keys = Array.from({ length: 4000 }, (_, i) => `session-${i}`);

describe('sessionAffinity', () => {
  it('asks the router for the session key', () => {
    expect(sessionAffinity()).toMatchObject({ name: 'session-affinity', usesAffinityKey: true });
  });

  it('sends a key to the same endpoint every time', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    for (const key of keys.slice(0, 100)) {
      const first = policy.pick(candidates, ctx(key));
      for (let i = 0; i < 5; i++) expect(policy.pick(candidates, ctx(key))).toBe(first);
    }
  });

  it('spreads keys about evenly', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    const counts = new Array(8).fill(0);
    for (const key of keys) counts[policy.pick(candidates, ctx(key)).rank]++;
    for (const count of counts) expect(Math.abs(count - 500)).toBeLessThan(100);
  });

  it('removing an endpoint moves only the keys it held', () => {
    const policy = sessionAffinity();
    const all = endpoints(8);
    const before = keys.map((key) => policy.pick(all, ctx(key)).rank);
    const without3 = all.filter((e) => e.rank !== 3);
    const after = keys.map((key) => policy.pick(without3, ctx(key)).rank);
    keys.forEach((_, i) => {
      if (before[i] !== 3) expect(after[i]).toBe(before[i]);
      else expect(after[i]).not.toBe(3);
    });
  });

  it('adding an endpoint moves keys only onto it', () => {
    const policy = sessionAffinity();
    const nine = endpoints(9);
    const eight = nine.slice(0, 8);
    const before = keys.map((key) => policy.pick(eight, ctx(key)).rank);
    const after = keys.map((key) => policy.pick(nine, ctx(key)).rank);
    let moved = 0;
    keys.forEach((_, i) => {
      if (after[i] !== before[i]) {
        expect(after[i]).toBe(8);
        moved++;
      }
    });
    expect(moved / keys.length).toBeGreaterThan(0.08);
    expect(moved / keys.length).toBeLessThan(0.15);
  });

  it('does not depend on endpoint object identity or order, only on keys', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    const copies = candidates.map((e) => ({ ...e })).reverse();
    for (const key of keys.slice(0, 200)) expect(policy.pick(copies, ctx(key)).key).toBe(policy.pick(candidates, ctx(key)).key);
  });

  it('skips an endpoint loaded above ⌈loadFactor × mean⌉ and returns when it drains', () => {
    const policy = sessionAffinity({ loadFactor: 1.25 });
    const candidates = endpoints(8, 2);
    const key = 'hot-session';
    const home = policy.pick(candidates, ctx(key));
    const loaded = candidates.map((e) => (e === home ? { ...e, load: 9, inflight: 9 } : e));
    // mean = (7 × 2 + 9) / 8 = 2.875; cap = ⌈3.59⌉ = 4 < 9
    const moved = policy.pick(loaded, ctx(key));
    expect(moved.key).not.toBe(home.key);
    expect(policy.pick(candidates, ctx(key)).key).toBe(home.key);
  });

  it('tolerates one request of slack near idle', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    const key = 'quiet-session';
    const home = policy.pick(candidates, ctx(key));
    const busyHome = candidates.map((e) => (e === home ? { ...e, load: 1, inflight: 1 } : e));
    expect(policy.pick(busyHome, ctx(key)).key).toBe(home.key);
  });

  it('uses the fallback without a key', () => {
    const calls: string[] = [];
    const fallback: Policy = {
      name: 'spy',
      pick(candidates) {
        calls.push('fallback');
        return candidates[candidates.length - 1];
      },
    };
    const policy = sessionAffinity({ fallback });
    const candidates = endpoints(4);
    expect(policy.pick(candidates, ctx(undefined))).toBe(candidates[3]);
    expect(policy.pick(candidates, ctx(''))).toBe(candidates[3]);
    expect(calls).toHaveLength(2);
  });

  it('rejects a load factor below 1', () => {
    expect(() => sessionAffinity({ loadFactor: 0.5 })).toThrow(TypeError);
    expect(() => sessionAffinity({ loadFactor: Number.NaN })).toThrow(/loadFactor/);
  });
});
