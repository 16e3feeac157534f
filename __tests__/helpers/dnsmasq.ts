import { spawn, type ChildProcess } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { createServer, type AddressInfo } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';

/** A real dnsmasq on 127.0.0.1 answering from a hosts file, NXDOMAIN for other names under `.test`. */
export interface Dnsmasq {
  /** `127.0.0.1:<port>`, for `dns.servers`. */
  readonly server: string;
  readonly port: number;
  /** Rewrites the hosts file (`[[address, name], …]`) and waits until dnsmasq has read it again (SIGHUP). */
  setHosts(hosts: ReadonlyArray<readonly [string, string]>): Promise<void>;
  /** Stops it (SIGTERM to its PID) and waits for it to exit: queries are then refused. */
  stop(): Promise<void>;
  /** Starts it again on the same port with the same hosts. */
  restart(): Promise<void>;
  close(): Promise<void>;
}

/**
 * A port on 127.0.0.1 free for both UDP and TCP when asked (dnsmasq binds both right after): a
 * port free for UDP may be another test's TCP socket, which made dnsmasq exit with EADDRINUSE.
 */
async function freeDnsPort(): Promise<number> {
  for (;;) {
    const tcp = createServer();
    await new Promise<void>((resolve) => tcp.listen(0, '127.0.0.1', resolve));
    const { port } = tcp.address() as AddressInfo;
    const udp = createSocket('udp4');
    const free = await new Promise<boolean>((resolve) => {
      udp.once('error', () => resolve(false));
      udp.bind(port, '127.0.0.1', () => resolve(true));
    });
    // After a failed bind there may be nothing left to close.
    await new Promise<void>((resolve) => {
      try {
        udp.close(() => resolve());
      } catch {
        resolve();
      }
    });
    await new Promise<void>((resolve) => tcp.close(() => resolve()));
    if (free) return port;
  }
}

/** How the test's dnsmasq answers what its hosts file does not hold. */
export interface DnsmasqOptions {
  /**
   * `true` (default): names under `.test` are answered from the hosts file alone (NXDOMAIN, or no
   * records of a type it lacks). `false`: such queries are forwarded, to no server at all, so
   * they are REFUSED: AAAA of a name the hosts file gives only IPv4 addresses, as a dnsmasq
   * without upstream servers answers it.
   */
  local?: boolean;
}

/** Starts dnsmasq (Debian's package) on a free loopback port, serving `hosts`. */
export async function startDnsmasq(hosts: ReadonlyArray<readonly [string, string]>, options: DnsmasqOptions = {}): Promise<Dnsmasq> {
  const dir = mkdtempSync(join(tmpdir(), 'dp-router-dnsmasq-'));
  const file = join(dir, 'hosts');
  const write = (entries: ReadonlyArray<readonly [string, string]>) => writeFileSync(file, entries.map(([address, name]) => `${address} ${name}\n`).join(''));
  write(hosts);
  const port = await freeDnsPort();
  let child: ChildProcess | undefined;
  let log = '';
  // dnsmasq logs `read <file> - N names` each time it has read the hosts file.
  const hostsRead = (since: number) => log.indexOf(`read ${file}`, since) !== -1;
  const waitForLog = (check: () => boolean, what: string) =>
    new Promise<void>((resolve, reject) => {
      if (check()) {
        resolve();
        return;
      }
      const running = child!;
      const onData = () => {
        if (!check()) return;
        running.stderr!.off('data', onData);
        running.off('exit', onExit);
        resolve();
      };
      const onExit = () => reject(new Error(`dnsmasq exited before it ${what}: ${log}`));
      running.stderr!.on('data', onData);
      running.once('exit', onExit);
    });
  const start = async () => {
    const since = log.length;
    child = spawn(
      'dnsmasq',
      [
        '--no-daemon',
        `--port=${port}`,
        '--listen-address=127.0.0.1',
        '--bind-interfaces',
        '--no-resolv',
        '--no-hosts',
        `--addn-hosts=${file}`,
        // Names under .test are answered from the hosts file alone: NXDOMAIN when not there.
        ...(options.local === false ? [] : ['--local=/test/']),
        '--log-facility=-',
        '--pid-file=',
        `--user=${userInfo().username}`,
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    child.stderr!.on('data', (chunk: Buffer) => {
      log += chunk.toString('utf8');
    });
    await waitForLog(() => hostsRead(since), 'read its hosts file');
  };
  const stop = async () => {
    const running = child;
    child = undefined;
    if (running === undefined || running.exitCode !== null) return;
    const exited = new Promise<void>((resolve) => running.once('exit', () => resolve()));
    running.kill('SIGTERM');
    await exited;
  };
  await start();
  return {
    server: `127.0.0.1:${port}`,
    port,
    async setHosts(entries) {
      write(entries);
      const since = log.length;
      child!.kill('SIGHUP');
      await waitForLog(() => hostsRead(since), 'read its hosts file again');
    },
    stop,
    restart: start,
    async close() {
      await stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
