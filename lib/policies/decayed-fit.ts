/**
 * Least squares over exponentially decayed sums, for the models the router learns online from
 * the timings it measures (prefix-aware's prefill cost, SLO routing's latency shape): a sample
 * adds its x·xᵀ and x·y to sums that forget at `decay` per sample, a few multiply-adds off the
 * decision; the normal equations are solved only when read after new samples.
 */
export class DecayedFit {
  private readonly xx: Float64Array;
  private readonly xy: Float64Array;
  /** The coefficients of the last successful solve (0 before one). */
  readonly theta: Float64Array;
  /** Samples added. */
  samples = 0;
  private stale = false;

  constructor(
    private readonly n: number,
    private readonly decay: number,
  ) {
    this.xx = new Float64Array(n * n);
    this.xy = new Float64Array(n);
    this.theta = new Float64Array(n);
  }

  add(x: readonly number[], y: number, weight = 1): void {
    const { n, xx, xy, decay } = this;
    for (let i = 0; i < n; i++) {
      xy[i] = xy[i] * decay + weight * x[i] * y;
      for (let j = 0; j < n; j++) xx[i * n + j] = xx[i * n + j] * decay + weight * x[i] * x[j];
    }
    this.samples++;
    this.stale = true;
  }

  /**
   * Solves again when samples came since the last solve: with `nonNegative`, each coefficient
   * held ≥ 0 (a time that grows with work); else the plain least-squares solution. Returns
   * whether `theta` was solved anew (false: no new sample, or the sums are singular).
   */
  refresh(nonNegative: boolean): boolean {
    if (!this.stale) return false;
    this.stale = false;
    const solved = nonNegative ? solveNonNegative(this.xx, this.xy, this.n) : solveAll(this.xx, this.xy, this.n);
    if (solved === undefined) return false;
    this.theta.set(solved);
    return true;
  }
}

/** The diagonal's small relative ridge keeps a degenerate fit (a constant feature, say) solvable. */
function ridged(xx: Float64Array, n: number, idx: readonly number[]): number[][] {
  return idx.map((i) => idx.map((j) => xx[i * n + j] * (i === j ? 1.001 : 1) + (i === j ? 1e-12 : 0)));
}

function solveAll(xx: Float64Array, xy: Float64Array, n: number): number[] | undefined {
  const idx = Array.from({ length: n }, (_, i) => i);
  return gauss(ridged(xx, n, idx), Array.from(xy), n);
}

/**
 * The least-squares solution with each coefficient ≥ 0: a negative one is dropped (held at 0)
 * and the rest refitted, at most n times.
 */
export function solveNonNegative(xx: Float64Array, xy: Float64Array, n: number): number[] | undefined {
  const free = new Array<boolean>(n).fill(true);
  for (let round = 0; round < n; round++) {
    const idx = free.flatMap((on, i) => (on ? [i] : []));
    if (idx.length === 0) return new Array<number>(n).fill(0);
    const m = idx.length;
    const solution = gauss(ridged(xx, n, idx), idx.map((i) => xy[i]), m);
    if (solution === undefined) return undefined;
    const negative = solution.findIndex((value) => value < 0);
    if (negative < 0) {
      const out = new Array<number>(n).fill(0);
      idx.forEach((i, at) => (out[i] = solution[at]));
      return out;
    }
    free[idx[negative]] = false;
  }
  return undefined;
}

function gauss(a: number[][], b: number[], m: number): number[] | undefined {
  for (let col = 0; col < m; col++) {
    let pivot = col;
    for (let row = col + 1; row < m; row++) if (Math.abs(a[row][col]) > Math.abs(a[pivot][col])) pivot = row;
    if (!(Math.abs(a[pivot][col]) > 0)) return undefined;
    [a[col], a[pivot]] = [a[pivot], a[col]];
    [b[col], b[pivot]] = [b[pivot], b[col]];
    for (let row = col + 1; row < m; row++) {
      const f = a[row][col] / a[col][col];
      for (let k = col; k < m; k++) a[row][k] -= f * a[col][k];
      b[row] -= f * b[col];
    }
  }
  const x = new Array<number>(m).fill(0);
  for (let row = m - 1; row >= 0; row--) {
    let sum = b[row];
    for (let k = row + 1; k < m; k++) sum -= a[row][k] * x[k];
    x[row] = sum / a[row][row];
  }
  return x.every(Number.isFinite) ? x : undefined;
}
