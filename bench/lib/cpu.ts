import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { resolve } from 'node:path';
import { createInterface } from 'node:readline';

/** Whether `taskset` exists and works here (Linux with util-linux). */
export function hasTaskset(): boolean {
  try {
    execFileSync('taskset', ['-p', String(process.pid)], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** Cores the benchmark can use. */
export function coreCount(): number {
  return cpus().length;
}

/** Pins every thread of this process to one core; returns whether it worked. */
export function pinSelf(core: number): boolean {
  try {
    execFileSync('taskset', ['-a', '-p', '-c', String(core), String(process.pid)], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** A benchmark child process that printed `READY <port>`. */
export interface BenchChild {
  readonly name: string;
  readonly port: number;
  readonly url: string;
  readonly process: ChildProcess;
  stop(): Promise<void>;
  /** Kills its whole process group at once (SIGKILL). */
  kill(): void;
}

/**
 * Every child still running, each the leader of its own process group: killed, group and all,
 * on every way this process ends (a normal exit, `process.exit` after an error, a signal), so
 * that no contender (a valgrind run takes minutes to notice its parent is gone) outlives it.
 */
const children = new Set<ChildProcess>();
let reaping = false;

function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // Already gone.
  }
}

function reapOnExit(): void {
  if (reaping) return;
  reaping = true;
  process.once('exit', () => {
    for (const child of children) killGroup(child, 'SIGKILL');
  });
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(signal, () => {
      for (const child of children) killGroup(child, 'SIGKILL');
      process.exit(128 + (signal === 'SIGINT' ? 2 : signal === 'SIGTERM' ? 15 : 1));
    });
  }
}

/**
 * Starts an entry point as its own Node process (a `.ts` one through tsx's loader), pinned to
 * `core` when taskset is available, under `launcher` when given (e.g. valgrind), and waits
 * until it prints `READY <port>`.
 */
export async function startChild(
  name: string,
  script: string,
  args: readonly string[],
  core: number | undefined,
  env: NodeJS.ProcessEnv = {},
  nodeArgs: readonly string[] = [],
  launcher: readonly string[] = [],
): Promise<BenchChild> {
  const loader = script.endsWith('.ts') ? ['--import', 'tsx'] : [];
  const node = [...launcher, process.execPath, ...nodeArgs, ...loader, resolve(script), ...args];
  const [command, ...commandArgs] = core === undefined ? node : ['taskset', '-c', String(core), ...node];
  reapOnExit();
  const child = spawn(command, commandArgs, {
    cwd: resolve(__dirname, '..', '..'),
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, NODE_ENV: 'production', ...env },
    // Its own process group, so that one kill reaches whatever it started (see `children`).
    detached: true,
  });
  children.add(child);
  child.once('exit', () => children.delete(child));
  const port = await new Promise<number>((resolvePort, reject) => {
    const lines = createInterface({ input: child.stdout! });
    // Under a launcher (valgrind) on a loaded machine, starting takes minutes; BENCH_READY_MS overrides.
    const readyMs = Number(process.env.BENCH_READY_MS) || (launcher.length > 0 ? 900_000 : 120_000);
    const timer = setTimeout(() => reject(new Error(`${name}: no READY line within ${readyMs / 1000} s`)), readyMs);
    lines.on('line', (line) => {
      const match = /^READY (\d+)$/.exec(line.trim());
      if (match) {
        clearTimeout(timer);
        resolvePort(Number(match[1]));
      }
    });
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited before READY (code ${code}, signal ${signal})`));
    });
    child.once('error', reject);
  }).catch((error: unknown) => {
    // No READY: nobody will stop it.
    killGroup(child, 'SIGKILL');
    throw error;
  });
  child.stdout!.resume();
  return {
    name,
    port,
    url: `http://127.0.0.1:${port}`,
    process: child,
    stop: () =>
      new Promise<void>((done) => {
        if (child.exitCode !== null || child.signalCode !== null) return done();
        child.once('exit', () => done());
        killGroup(child, 'SIGTERM');
        setTimeout(() => killGroup(child, 'SIGKILL'), 3000).unref();
      }),
    kill: () => killGroup(child, 'SIGKILL'),
  };
}

/** Clock ticks per second of /proc/<pid>/stat's times (USER_HZ, 100 on Linux). */
const USER_HZ = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/**
 * CPU time (user + system) a process has used, in milliseconds, from /proc; `undefined`
 * where /proc is not available. Per request, it is the contender's cost with the time it
 * spent descheduled left out, so it holds on a machine that other work shares.
 */
export function processCpuMs(pid: number | undefined): number | undefined {
  return cpuMsOf(pid, `/proc/${pid}/stat`);
}

/** CPU time of a process's main thread alone (JavaScript and the GC it runs), as {@link processCpuMs}. */
export function mainThreadCpuMs(pid: number | undefined): number | undefined {
  return cpuMsOf(pid, `/proc/${pid}/task/${pid}/stat`);
}

function cpuMsOf(pid: number | undefined, path: string): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const stat = readFileSync(path, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // After "pid (comm) ", field 3 (state) is index 0: utime is field 14, stime 15.
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / USER_HZ;
  } catch {
    return undefined;
  }
}

/** The machine's CPU pressure (share of time some task waited for a CPU, last 10 s), if known. */
export function cpuPressure(): number | undefined {
  try {
    const match = /some avg10=([\d.]+)/.exec(readFileSync('/proc/pressure/cpu', 'utf8'));
    return match ? Number(match[1]) : undefined;
  } catch {
    return undefined;
  }
}
