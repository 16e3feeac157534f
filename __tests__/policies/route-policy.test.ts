import { describe, expect, it } from '@jest/globals';
import { ExactPick } from '../../lib/policies/exact-pick';
import { prefixAware, type PrefixPickContext } from '../../lib/policies/prefix-aware';
import { roundRobin } from '../../lib/policies/round-robin';
import { routePolicy } from '../../lib/policies/route-policy';
import type { Endpoint, PickContext, Policy } from '../../lib/types';

const endpoints: Endpoint[] = Array.from({ length: 4 }, (_, rank) => ({ key: `gpu#${rank}`, upstream: 'gpu', rank, inflight: 0, load: 0, healthy: true }));
const ctx = (prompt: string | undefined): PickContext => ({ path: '/v1/completions', affinityKey: undefined, prompt });
/** Deterministic text of `blocks` 64-character blocks, distinct per seed. */
const text = (seed: string, blocks: number): string => `${seed}:`.padEnd(64, '.').repeat(blocks);

describe('routePolicy', () => {
  it("reads a plain policy's flags once, as booleans, and returns its endpoint as the result", () => {
    const policy = routePolicy(roundRobin());
    expect(policy).toMatchObject({ name: 'round-robin', usesPrompt: false, usesAffinityKey: false, readsContext: false, namesIndex: false, reportsMatchedShare: false, reportsUncachedBlocks: false, learnsFirstTokens: false });
    const first = policy.pick(endpoints, ctx(undefined));
    expect(first).toMatchObject({ endpoint: endpoints[0], index: 'approximate', matchedShare: undefined, uncachedBlocks: undefined });
    expect(policy.pick(endpoints, ctx(undefined)).endpoint).toBe(endpoints[1]);
  });

  it("takes a user's policy that reports its estimates at the pick, before another pick changes them", () => {
    let share = 0;
    const user: Policy & { matchedShare: number; uncachedBlocks: number } = {
      name: 'mine',
      reportsMatchedShare: true,
      get matchedShare() {
        return share;
      },
      get uncachedBlocks() {
        return Math.round((1 - share) * 10);
      },
      pick(candidates, context) {
        share = context.prompt === 'seen' ? 0.75 : 0;
        return candidates[candidates.length - 1];
      },
    };
    const policy = routePolicy(user);
    expect(policy).toMatchObject({ reportsMatchedShare: true, reportsUncachedBlocks: true, readsContext: true });
    const found = policy.pick(endpoints, ctx('seen'));
    const kept = { share: found.matchedShare, blocks: found.uncachedBlocks };
    expect(kept).toEqual({ share: 0.75, blocks: 3 });
    // One result per policy, filled again by the next pick: whoever needs it later copies it.
    expect(policy.pick(endpoints, ctx('new'))).toMatchObject({ matchedShare: 0, uncachedBlocks: 10 });
  });

  it("names the index a user's policy that scores on one chose, by the exact view it was given", () => {
    const user: Policy = {
      name: 'exact-first',
      namesIndex: true,
      pick(candidates, context) {
        const exact = (context as PrefixPickContext).exact;
        const at = exact === undefined ? 0 : exact.matched.findIndex((held) => held >= 0);
        exact?.chose(at);
        return candidates[at];
      },
    };
    const policy = routePolicy(user);
    expect(policy.pick(endpoints, { ...ctx('p'), exact: new ExactPick(4, Int32Array.from([-1, -1, 3, -1])) } as PrefixPickContext)).toMatchObject({ endpoint: endpoints[2], index: 'exact' });
    expect(policy.pick(endpoints, ctx('p'))).toMatchObject({ endpoint: endpoints[0], index: 'approximate' });
  });

  it("keeps prefix-aware's own pick: its result is what its public pick and getters say", () => {
    const publicPolicy = prefixAware();
    const policy = routePolicy(publicPolicy);
    expect(policy).toMatchObject({ name: 'prefix-aware', usesPrompt: true, namesIndex: true, reportsMatchedShare: true, reportsUncachedBlocks: true, learnsFirstTokens: true });
    const prompt = text('system', 8);
    const first = policy.pick(endpoints, ctx(prompt));
    expect(first).toMatchObject({ index: 'approximate', matchedShare: 0, uncachedBlocks: 8 });
    const home = first.endpoint;
    const again = policy.pick(endpoints, ctx(prompt));
    expect(again).toMatchObject({ endpoint: home, matchedShare: 1, uncachedBlocks: 0 });
    expect(publicPolicy).toMatchObject({ matchedShare: 1, uncachedBlocks: 0 });
    // The public pick is the same pick.
    expect(publicPolicy.pick(endpoints, ctx(prompt + text('turn', 8)))).toBe(home);
    expect(publicPolicy).toMatchObject({ matchedShare: 0.5, uncachedBlocks: 8 });
  });

  it('says when a prefix-aware pick was scored on the exact index', () => {
    const policy = routePolicy(prefixAware());
    const found = policy.pick(endpoints, { ...ctx(text('exact', 4)), exact: new ExactPick(4, Int32Array.from([-1, 4, -1, -1])) } as PrefixPickContext);
    expect(found).toMatchObject({ endpoint: endpoints[1], index: 'exact', matchedShare: 1, uncachedBlocks: 0 });
  });
});
