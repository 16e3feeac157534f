import { describe, expect, it } from '@jest/globals';
import { powerOfTwo } from '../../lib/policies/power-of-two';
import { fakeEndpoints, NO_CONTEXT, seededRandom } from './fake-endpoints';

describe('powerOfTwo', () => {
  it('never picks the most loaded of several candidates', () => {
    const endpoints = fakeEndpoints(4, [0, 0, 0, 100]);
    const policy = powerOfTwo(seededRandom(1));
    for (let index = 0; index < 500; index++) expect(policy.pick(endpoints, NO_CONTEXT).rank).not.toBe(3);
  });

  it('compares two distinct candidates: with two, always the lighter', () => {
    const endpoints = fakeEndpoints(2, [5, 1]);
    const policy = powerOfTwo(seededRandom(3));
    for (let index = 0; index < 100; index++) expect(policy.pick(endpoints, NO_CONTEXT).rank).toBe(1);
  });

  it('returns the only candidate', () => {
    expect(powerOfTwo().pick(fakeEndpoints(1), NO_CONTEXT).rank).toBe(0);
  });

  it('keeps load nearly even when every pick adds load', () => {
    const endpoints = fakeEndpoints(8);
    const policy = powerOfTwo(seededRandom(9));
    for (let index = 0; index < 800; index++) (policy.pick(endpoints, NO_CONTEXT) as (typeof endpoints)[number]).load++;
    const loads = endpoints.map((endpoint) => endpoint.load);
    expect(Math.max(...loads) - Math.min(...loads)).toBeLessThanOrEqual(3);
  });
});
