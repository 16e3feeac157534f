import type { Agent } from 'node:http';
import type { Socket } from 'node:net';

/**
 * Closes the agent's free sockets once they have been idle for `idleMs` (at most; at least
 * `idleMs` minus two sweeps), so that a request is never sent down a connection the server is
 * about to close (uvicorn, under vLLM, closes idle keep-alive connections after 5 s).
 *
 * Node's agent `timeout` would do it at a price paid on every request: a socket timer
 * refreshed on each read and write, and a listener added and removed. A sweep of the free
 * list costs nothing per request. A socket counts as idle while its byte counts stand still.
 * Returns a function that stops the sweep.
 */
export function closeIdleSockets(agent: Agent, idleMs: number): () => void {
  const sweepMs = Math.max(1, Math.floor(idleMs / 4));
  let idle = new Map<Socket, { activity: number; since: number }>();
  const sweep = () => {
    const now = performance.now();
    const stillIdle = new Map<Socket, { activity: number; since: number }>();
    for (const sockets of Object.values(agent.freeSockets)) {
      for (const socket of sockets ?? []) {
        const activity = socket.bytesRead + socket.bytesWritten;
        const seen = idle.get(socket);
        const since = seen !== undefined && seen.activity === activity ? seen.since : now;
        // Idle since some time in the sweep before `since`: close while that is below idleMs.
        if (now - since >= idleMs - 2 * sweepMs) socket.destroy();
        else stillIdle.set(socket, { activity, since });
      }
    }
    idle = stillIdle;
  };
  const timer = setInterval(sweep, sweepMs);
  timer.unref();
  return () => clearInterval(timer);
}
