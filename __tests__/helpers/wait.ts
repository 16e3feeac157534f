/** Resolves after `ms`; only where a test needs time itself to pass, never to wait for an event. */
export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Polls `check` every `intervalMs` (10) until it returns true; fails after `timeoutMs` (5000)
 * with `describe()` or "condition not met in time". A check that throws counts as not yet (a
 * server still starting refuses connections); its last error is in the failure message.
 */
export async function waitFor(
  check: () => boolean | Promise<boolean>,
  timeoutMs = 5000,
  describe: string | (() => string) = 'condition not met in time',
  intervalMs = 10,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      if (await check()) return;
      lastError = undefined;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > deadline) {
      const message = typeof describe === 'string' ? describe : describe();
      throw new Error(lastError === undefined ? message : `${message} (last check threw: ${String(lastError)})`);
    }
    await sleep(intervalMs);
  }
}
