import { afterEach } from '@jest/globals';

/** Anything a test starts and must stop: servers, gateways, mocks. */
export interface Closable {
  close(): Promise<void> | void;
}

/**
 * Gives a test file a `closed(thing)` that returns `thing` and closes it after the current
 * test, all together, whether the test passed or not.
 */
export function closedAfterEach(): <T extends Closable>(thing: T) => T {
  const started: Closable[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((thing) => thing.close()));
  });
  return (thing) => {
    started.push(thing);
    return thing;
  };
}
