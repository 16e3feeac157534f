/**
 * The KV-event transport and codec are optional peer dependencies: they are loaded on first
 * use, so an install without them works until `kvEvents` is configured.
 */
import type * as Zeromq from 'zeromq';
import type * as Msgpackr from 'msgpackr';

const INSTALL = 'npm install zeromq msgpackr';

let zeromq: typeof Zeromq | undefined;
let msgpackr: typeof Msgpackr | undefined;

/** `zeromq`, or an Error naming the install command. */
export function loadZeromq(): typeof Zeromq {
  zeromq ??= load<typeof Zeromq>('zeromq');
  return zeromq;
}

/** `msgpackr`, or an Error naming the install command. */
export function loadMsgpackr(): typeof Msgpackr {
  msgpackr ??= load<typeof Msgpackr>('msgpackr');
  return msgpackr;
}

function load<T>(name: string): T {
  return requireOptional<T>(name, 'KV events need', INSTALL);
}

/** Requires an optional peer dependency, or throws an Error saying what needs it and how to install it. */
export function requireOptional<T>(name: string, neededBy: string, install: string): T {
  try {
    return require(name) as T;
  } catch (error) {
    throw new Error(`${neededBy} the optional package "${name}", which could not be loaded (${(error as Error).message}). Install it with: ${install}`);
  }
}
