/** Small helpers shared by the benchmarks. */

export function median(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

/** The q-quantile (0..1) of already-sorted values, nearest rank. */
export function quantileSorted(sorted: ArrayLike<number>, q: number): number {
  if (sorted.length === 0) return NaN;
  const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[index];
}

/** A Markdown table; numbers are printed as given (format them first). */
export function markdownTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((cell, column) => Math.max(cell.length, ...rows.map((row) => row[column].length)));
  const line = (cells: readonly string[]) =>
    `| ${cells.map((cell, column) => (column === 0 ? cell.padEnd(widths[column]) : cell.padStart(widths[column]))).join(' | ')} |`;
  const rule = `| ${widths.map((width, column) => (column === 0 ? '-'.repeat(width) : '-'.repeat(width - 1) + ':')).join(' | ')} |`;
  return [line(header), rule, ...rows.map(line)].join('\n');
}

/** A plain-text table as the simulators print it: the first column left-aligned, the rest right, two spaces apart, a dashed rule under the header. */
export function textTable(header: readonly string[], rows: readonly (readonly string[])[]): string[] {
  const widths = header.map((cell, column) => Math.max(cell.length, ...rows.map((row) => row[column].length)));
  const line = (cells: readonly string[]) => cells.map((cell, column) => (column === 0 ? cell.padEnd(widths[column]) : cell.padStart(widths[column]))).join('  ');
  return [line(header), widths.map((width) => '-'.repeat(width)).join('  '), ...rows.map(line)];
}

/** A share as a percentage with one decimal: `0.8214` → `82.1%`. */
export function percent(share: number): string {
  return `${(share * 100).toFixed(1)}%`;
}

/** A signed number with `digits` decimals: `+5.2`, `-1.1`; `n/a` when not finite. */
export function signed(value: number, digits: number): string {
  return Number.isFinite(value) ? `${value >= 0 ? '+' : ''}${value.toFixed(digits)}` : 'n/a';
}

export function fixed(value: number, digits: number): string {
  return Number.isFinite(value) ? value.toFixed(digits) : 'n/a';
}

/** Parses `--name value` / `--flag` arguments. */
export function parseArgs(argv: readonly string[]): Map<string, string | true> {
  const args = new Map<string, string | true>();
  for (let index = 0; index < argv.length; index++) {
    const arg = argv[index];
    if (!arg.startsWith('--')) throw new Error(`unexpected argument '${arg}'`);
    const eq = arg.indexOf('=');
    if (eq > 0) {
      args.set(arg.slice(2, eq), arg.slice(eq + 1));
    } else if (index + 1 < argv.length && !argv[index + 1].startsWith('--')) {
      args.set(arg.slice(2), argv[++index]);
    } else {
      args.set(arg.slice(2), true);
    }
  }
  return args;
}
