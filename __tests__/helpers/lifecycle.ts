import { afterEach } from '@jest/globals';

/** Anything a test starts and must stop: servers, gateways, mocks. */
export interface Closable {
  close(): Promise<void> | void;
}

/**
 * A list for what a test file starts (`started.push(server)`): after each test, whatever its
 * outcome, everything in it is closed, all together, and the list emptied.
 */
export function closedAfterEach(): Closable[] {
  const started: Closable[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((thing) => thing.close()));
  });
  return started;
}
