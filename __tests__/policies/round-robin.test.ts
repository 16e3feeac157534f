import { describe, expect, it } from '@jest/globals';
import { roundRobin } from '../../lib/policies/round-robin';
import { fakeEndpoints, NO_CONTEXT } from './fake-endpoints';

describe('roundRobin', () => {
  it('cycles in order, ignoring load', () => {
    const endpoints = fakeEndpoints(3, [9, 0, 0]);
    const policy = roundRobin();
    expect(Array.from({ length: 7 }, () => policy.pick(endpoints, NO_CONTEXT).rank)).toEqual([0, 1, 2, 0, 1, 2, 0]);
  });

  it('keeps cycling when the candidate list shrinks', () => {
    const policy = roundRobin();
    policy.pick(fakeEndpoints(4), NO_CONTEXT);
    const two = fakeEndpoints(2);
    expect(new Set(Array.from({ length: 4 }, () => policy.pick(two, NO_CONTEXT).rank))).toEqual(new Set([0, 1]));
  });
});
