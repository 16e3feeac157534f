import { spawn, type ChildProcess } from 'node:child_process';
import { freePort } from './ports';
import { waitFor } from './wait';

/** A real redis-server on a free loopback port, without persistence; `stop()` kills it by PID. */
export interface TestRedis {
  readonly port: number;
  readonly url: string;
  stop(): Promise<void>;
}

/** `args`: more of redis-server's own flags, e.g. `['--requirepass', 'pw']`. */
export async function startRedis(port?: number, args: readonly string[] = []): Promise<TestRedis> {
  const chosen = port ?? (await freePort());
  const child: ChildProcess = spawn('redis-server', ['--port', String(chosen), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  let killed = false;
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  await waitFor(() => output.includes('Ready to accept connections') || child.exitCode !== null, 5000, () => `redis-server did not start: ${output}`);
  if (child.exitCode !== null) throw new Error(`redis-server exited: ${output}`);
  return {
    port: chosen,
    url: `redis://127.0.0.1:${chosen}`,
    stop: async () => {
      if (!killed) {
        killed = true;
        process.kill(child.pid!, 'SIGKILL');
      }
      await exited;
    },
  };
}
