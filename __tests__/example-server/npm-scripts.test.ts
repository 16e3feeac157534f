/**
 * `npm start` and `npm run mock` as a user runs them, stopped as a container runtime or a
 * process supervisor stops them: one SIGTERM to the npm process, nothing to the rest of its
 * group. npm forwards it to the script's shell, which must not be left between npm and node
 * (a shell that is not the script's last process dies of the signal and orphans node, which
 * keeps its ports).
 */
import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { waitFor } from '../helpers';
import { expressMajor } from '../helpers/app';

const ROOT = join(__dirname, '..', '..');

/** Whether nothing listens on the port any more: a listener of our own can take it. */
function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
  });
}

/**
 * Spawns `npm args…` in a process group of its own (so that whatever it leaves behind can be
 * cleaned up), sends SIGTERM to the npm process alone in the same turn as the `listening` line
 * arrives (as a supervisor that starts routing and stopping on that line may: a child that
 * prints it before it handles SIGTERM dies of the signal), and returns the ports the line named
 * and npm's exit.
 */
async function sigtermToNpm(args: string[], listening: RegExp): Promise<{ ports: number[]; exit: { code: number | null; signal: NodeJS.Signals | null }; out: string }> {
  const npm = spawn('npm', args, { cwd: ROOT, detached: true });
  let out = '';
  let ports: number[] | undefined;
  const onOutput = (chunk: Buffer) => {
    out += chunk.toString();
    if (ports !== undefined) return;
    const line = listening.exec(out);
    if (line === null) return;
    ports = line.slice(1).map(Number);
    npm.kill('SIGTERM');
  };
  npm.stdout.on('data', onOutput);
  npm.stderr.on('data', onOutput);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => npm.on('exit', (code, signal) => resolve({ code, signal })));
  try {
    await waitFor(() => ports !== undefined || npm.exitCode !== null || npm.signalCode !== null, 30_000, () => `no ${listening} in ${JSON.stringify(out)}`);
    const exit = await exited;
    if (ports === undefined) throw new Error(`npm exited (${JSON.stringify(exit)}) before ${listening}: ${out}`);
    const held = ports;
    await waitFor(async () => (await Promise.all(held.map(portFree))).every(Boolean), 10_000, () => `a port of ${held.join(', ')} is still held after npm exited: ${out}`);
    return { ports: held, exit, out };
  } finally {
    try {
      process.kill(-npm.pid!, 'SIGKILL');
    } catch {
      // the group is gone: nothing was left behind
    }
  }
}

// The child processes load express 5 whatever the jest project maps `express` to: run them once.
const describeProcess = expressMajor === 4 ? describe.skip : describe;

describeProcess('SIGTERM to the npm process', () => {
  it('48.6: `npm start` drains, exits 0 and frees the gateway\'s and the embedded mock\'s ports', async () => {
    const { exit, out } = await sigtermToNpm(['start', '--', '--port', '0'], /listening on http:\/\/127\.0\.0\.1:(\d+) → embedded mock vLLM http:\/\/127\.0\.0\.1:(\d+)/);
    expect(out).toContain('SIGTERM: draining in-flight requests');
    expect({ ...exit, out }).toMatchObject({ code: 0, signal: null });
  }, 60_000);

  it('48.6: `npm run mock` exits 0 and frees its port', async () => {
    const { exit, out } = await sigtermToNpm(['run', 'mock', '--', '--port', '0'], /mock vLLM listening on http:\/\/127\.0\.0\.1:(\d+)/);
    expect({ ...exit, out }).toMatchObject({ code: 0, signal: null });
  }, 60_000);
});
