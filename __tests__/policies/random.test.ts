import { describe, expect, it } from '@jest/globals';
import { random } from '../../lib/policies/random';
import { fakeEndpoints, NO_CONTEXT, seededRandom } from './fake-endpoints';

describe('random', () => {
  it('picks every candidate, roughly uniformly, from the given source', () => {
    const endpoints = fakeEndpoints(4);
    const policy = random(seededRandom(7));
    const counts = [0, 0, 0, 0];
    for (let index = 0; index < 4000; index++) counts[policy.pick(endpoints, NO_CONTEXT).rank]++;
    for (const count of counts) expect(count).toBeGreaterThan(850);
  });

  it('is repeatable with a seeded source', () => {
    const endpoints = fakeEndpoints(8);
    const run = () => {
      const policy = random(seededRandom(42));
      return Array.from({ length: 20 }, () => policy.pick(endpoints, NO_CONTEXT).rank);
    };
    expect(run()).toEqual(run());
  });
});
