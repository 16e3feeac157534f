import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { waitFor } from './wait';

/** The repository's root: README commands run from here. */
const ROOT = join(__dirname, '..', '..');

/** A command run in a process group of its own (`npm …` and the node it starts). */
export interface StartedCommand {
  /** The URL the command printed (the first group of `listening`). */
  readonly url: string;
  /** SIGTERM to the whole group; resolves when the command has exited. */
  stop(): Promise<void>;
  /** Everything it wrote, stdout and stderr. */
  out(): string;
}

/**
 * Runs a README command line (`args`) from the repository's root in a process group of its own,
 * and resolves once its output matches `listening` (within 30 s); rejects, with the group
 * stopped, if it exits or never says so.
 */
export async function runCommand(args: readonly string[], listening: RegExp): Promise<StartedCommand> {
  const child = spawn(args[0], args.slice(1), { cwd: ROOT, detached: true });
  const closed = new Promise<void>((resolve) => child.on('close', () => resolve()));
  let out = '';
  child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
  const stop = async () => {
    try {
      process.kill(-child.pid!, 'SIGTERM');
    } catch {
      // already gone
    }
    await closed;
  };
  try {
    await waitFor(() => listening.test(out) || child.exitCode !== null, 30_000, () => `no ${listening} in ${JSON.stringify(out)}`);
  } catch (error) {
    await stop();
    throw error;
  }
  if (!listening.test(out)) throw new Error(`exited: ${out}`);
  return { url: listening.exec(out)![1], stop, out: () => out };
}
