/** The flags both simulators take. */
export interface SimArgs {
  /** `small` is the CI smoke size; `full` the published one. Default `full`. */
  size: 'small' | 'full';
  /** Directory for the JSON (and SVG) written. Default `bench/results`. */
  out: string;
  /** Default 42. */
  seed: number;
}

/**
 * Parses `--size small|full`, `--out DIR` and `--seed N`, and hands any other flag with its value
 * to `other`, which returns whether it took it; throws with `usage` otherwise.
 */
export function parseSimArgs(argv: readonly string[], usage: string, other: (flag: string, value: string) => boolean = () => false): SimArgs {
  const args: SimArgs = { size: 'full', out: 'bench/results', seed: 42 };
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (flag === '--size' && (value === 'small' || value === 'full')) args.size = value;
    else if (flag === '--out' && value) args.out = value;
    else if (flag === '--seed' && value && Number.isInteger(Number(value))) args.seed = Number(value);
    else if (value === undefined || !other(flag, value)) throw new Error(`unknown or incomplete flag ${flag}; usage: ${usage}`);
  }
  return args;
}
