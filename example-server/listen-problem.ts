/** Why a listener could not bind, in words, by error code. */
const REASONS: Readonly<Record<string, string>> = {
  EADDRINUSE: 'another process holds that port',
  EACCES: 'not permitted (ports below 1024 need privileges)',
  EADDRNOTAVAIL: 'no interface of this machine has that address',
};

/**
 * A bind failure as the person starting the server needs it: which listener, where, why, and the
 * flag or variable that moves it (`fix`). The error keeps its `code`; other errors pass as they are.
 */
export function listenProblem(error: unknown, listener: string, address: string, fix: string): unknown {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  if (code === undefined || !Object.hasOwn(REASONS, code)) return error;
  return Object.assign(new Error(`${listener} cannot listen on ${address}: ${REASONS[code]} (${code}); ${fix}`), { code });
}
