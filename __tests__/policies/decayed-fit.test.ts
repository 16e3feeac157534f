import { describe, expect, it } from '@jest/globals';
import { DecayedFit, solveNonNegative } from '../../lib/policies/decayed-fit';

describe('solveNonNegative', () => {
  it('solves the normal equations, and holds a coefficient that would go negative at 0', () => {
    // y = 2x + 1 exactly, at x = 0..3: xx = [[14, 6], [6, 4]], xy = [34, 16].
    // (The small ridge that keeps degenerate fits solvable moves them by about 0.1 %.)
    const [slope, constant] = solveNonNegative(Float64Array.from([14, 6, 6, 4]), Float64Array.from([34, 16]), 2)!;
    expect(slope).toBeCloseTo(2, 1);
    expect(constant).toBeCloseTo(1, 1);
    // y = 5 − x: the slope would be negative; held at 0, the constant is the mean (3.5).
    const [held, mean] = solveNonNegative(Float64Array.from([14, 6, 6, 4]), Float64Array.from([16, 14]), 2)!;
    expect(held).toBe(0);
    expect(mean).toBeCloseTo(3.5, 2);
  });
});

describe('DecayedFit', () => {
  // y = 3x − 2 at x = 1..4: Σx² 30, Σx 10, n 4, Σxy 70, Σy 22. The plain solution keeps the
  // negative intercept, the non-negative one holds it at 0 and refits the slope alone. Both with
  // the diagonal's ridge (× 1.001), by hand: [[30.03, 10], [10, 4.004]] θ = [70, 22] gives
  // θ = (60.28, −39.34) / 20.24012 = (2.97824, −1.94367); the slope alone 70 / 30.03 = 2.33100.
  const fitted = () => {
    const fit = new DecayedFit(2, 1);
    for (let x = 1; x <= 4; x++) fit.add([x, 1], 3 * x - 2);
    return fit;
  };

  it('solves the plain least squares, negative coefficients included', () => {
    const fit = fitted();
    expect(fit.refresh(false)).toBe(true);
    expect(fit.theta[0]).toBeCloseTo(2.97824, 4);
    expect(fit.theta[1]).toBeCloseTo(-1.94367, 4);
  });

  it('holds a negative coefficient at 0 and refits the rest, when asked', () => {
    const fit = fitted();
    expect(fit.refresh(true)).toBe(true);
    expect(fit.theta[0]).toBeCloseTo(2.331, 3);
    expect(fit.theta[1]).toBe(0);
  });

  it('solves again only after a new sample, and forgets old samples at its decay', () => {
    const fit = new DecayedFit(1, 0.5);
    fit.add([1], 10);
    expect(fit.refresh(true)).toBe(true);
    expect(fit.refresh(true)).toBe(false);
    // Sums after the second sample: Σx² = 0.5 + 1, Σxy = 0.5 × 10 + 4: θ = 9 / (1.5 × 1.001) = 5.99401.
    fit.add([1], 4);
    expect(fit.refresh(true)).toBe(true);
    expect(fit.theta[0]).toBeCloseTo(5.99401, 4);
  });
});
