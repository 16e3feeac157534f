import { describe, expect, it } from '@jest/globals';
import { BodyBudget } from '../../lib/http/body-budget';

describe('BodyBudget', () => {
  it('gives bytes while they fit and takes them back once per lease', () => {
    const budget = new BodyBudget(100);
    const first = budget.lease();
    const second = budget.lease();
    expect(first.grow(60)).toBe(true);
    expect(second.grow(50)).toBe(false);
    expect(second.held).toBe(0);
    expect(second.grow(40)).toBe(true);
    expect(budget.used).toBe(100);
    first.release();
    first.release();
    expect(budget.used).toBe(40);
    expect(first.grow(10)).toBe(false);
    second.shrink(15);
    expect(budget.used).toBe(25);
    second.release();
    expect(budget.used).toBe(0);
  });
});
