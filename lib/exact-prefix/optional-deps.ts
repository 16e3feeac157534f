/**
 * The KV-event transport is an optional peer dependency: it is loaded on first use, so an
 * install without it works until `kvEvents` is configured. (The payloads are decoded by the
 * router's own MessagePack reader, events/msgpack-reader.ts.)
 */
import type * as Zeromq from 'zeromq';

const INSTALL = 'npm install zeromq';

let zeromq: typeof Zeromq | undefined;

/** `zeromq`, or an Error naming the install command. */
export function loadZeromq(): typeof Zeromq {
  zeromq ??= load<typeof Zeromq>('zeromq');
  return zeromq;
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
