/**
 * Exact prefix routing's optional peer dependencies: the KV-event transport (zeromq) and the
 * tokenizer's packages. Each is loaded on first use, so an install without them works until
 * `kvEvents` or `prefixAware.tokenizer` is configured. (The payloads are decoded by the router's
 * own MessagePack reader, events/msgpack-reader.ts.)
 */
import type * as Zeromq from 'zeromq';

/** Every optional package exact prefix routing loads, in the order of the install command. */
const EXACT_ROUTING_PACKAGES = ['zeromq', '@huggingface/tokenizers', '@huggingface/jinja'] as const;

/** An optional package that could not be loaded; the message says, on one line, every one exact routing lacks and the install command. */
export class OptionalPackageError extends Error {
  /** What installs every package exact routing lacks, e.g. `Install them with: npm install zeromq @huggingface/jinja`. */
  readonly install: string;

  constructor(
    /** What is missing and what needs it. */
    readonly problem: string,
    /** The packages to install. */
    readonly packages: readonly string[],
  ) {
    const install = `Install ${packages.length === 1 ? 'it' : 'them'} with: npm install ${packages.join(' ')}`;
    super(`${problem}. ${install}`);
    this.name = 'OptionalPackageError';
    this.install = install;
  }
}

let zeromq: typeof Zeromq | undefined;

/** `zeromq`, or an {@link OptionalPackageError}. */
export function loadZeromq(): typeof Zeromq {
  zeromq ??= requireOptional<typeof Zeromq>('zeromq', 'KV events need');
  return zeromq;
}

/**
 * Requires an optional peer dependency, or throws an {@link OptionalPackageError} naming it,
 * what needs it, the other packages of exact routing that are missing too (so one install
 * fixes everything), and the install command. Node's "Require stack" is left out.
 */
export function requireOptional<T>(name: string, neededBy: string): T {
  try {
    return require(name) as T;
  } catch (error) {
    throw optionalPackageError(name, neededBy, error as NodeJS.ErrnoException);
  }
}

function optionalPackageError(name: string, neededBy: string, error: NodeJS.ErrnoException): OptionalPackageError {
  const reason = error.message.split('\n')[0];
  // Not found itself, rather than found and broken (a native binary built for another Node).
  const absent = error.code === 'MODULE_NOT_FOUND' && reason.includes(`'${name}'`);
  const others = EXACT_ROUTING_PACKAGES.filter((other) => other !== name && !resolvable(other));
  const also = others.length === 0 ? '' : `; ${others.map((other) => `"${other}"`).join(' and ')} ${others.length === 1 ? 'is' : 'are'} not installed either`;
  const what = absent ? 'which is not installed' : `which could not be loaded (${reason})`;
  const packages = EXACT_ROUTING_PACKAGES.filter((other) => other === name || others.includes(other));
  return new OptionalPackageError(`${neededBy} the optional package "${name}", ${what}${also}`, packages.length > 0 ? packages : [name]);
}

function resolvable(name: string): boolean {
  try {
    require.resolve(name);
    return true;
  } catch {
    return false;
  }
}
