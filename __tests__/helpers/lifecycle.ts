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

/** Waits for what `starting` starts and puts it on `started` (a {@link closedAfterEach} list): closed after the test. */
export async function keptIn<T extends Closable>(started: Closable[], starting: Promise<T>): Promise<T> {
  const thing = await starting;
  started.push(thing);
  return thing;
}
