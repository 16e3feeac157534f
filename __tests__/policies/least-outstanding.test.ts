import { describe, expect, it } from '@jest/globals';
import { leastOutstanding } from '../../lib/policies/least-outstanding';
import { fakeEndpoints, NO_CONTEXT } from './fake-endpoints';

describe('leastOutstanding', () => {
  it('picks the least loaded endpoint', () => {
    const endpoints = fakeEndpoints(4, [3, 1, 0, 2]);
    const policy = leastOutstanding();
    for (let index = 0; index < 5; index++) expect(policy.pick(endpoints, NO_CONTEXT).rank).toBe(2);
  });

  it('rotates among ties instead of piling onto the first', () => {
    const endpoints = fakeEndpoints(4, [1, 0, 1, 0]);
    const policy = leastOutstanding();
    const picks = Array.from({ length: 8 }, () => policy.pick(endpoints, NO_CONTEXT).rank);
    expect(new Set(picks)).toEqual(new Set([1, 3]));
    expect(picks.filter((rank) => rank === 1)).toHaveLength(4);
  });

  it('spreads evenly when every pick adds load', () => {
    const endpoints = fakeEndpoints(8);
    const policy = leastOutstanding();
    for (let index = 0; index < 80; index++) {
      const chosen = policy.pick(endpoints, NO_CONTEXT) as (typeof endpoints)[number];
      chosen.load++;
    }
    expect(endpoints.map((endpoint) => endpoint.load)).toEqual(Array(8).fill(10));
  });
});
