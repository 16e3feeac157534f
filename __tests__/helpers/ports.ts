import { createSocket } from 'node:dgram';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

/**
 * Free ports for servers that must be told theirs before they start (a child process's flags,
 * peers that list each other, a port nothing listens on), chosen BELOW the kernel's ephemeral
 * range. A port that listen(0) or bind(0) handed out and that was then released can go to any
 * other process's listen(0), bind(0) or connect() before ours binds it: with two jest workers, a
 * server of the other test file, which then answers in place of the one that failed to start
 * (bench:gateways took an echo upstream's 200 for its gateway's /healthz and waited forever for
 * the dead gateway). Below the range only explicit binds, as these, can take a port.
 * (bench/lib/ports.ts re-exports these: tests import nothing from bench/.)
 */

/** The lowest port handed out; below 10000 are well-known services' ports in use on developer machines. */
const LOWEST = 10_000;

/** Where the kernel's ephemeral range starts: Linux's setting, else 32768 (below every other OS's default). */
export function ephemeralStart(): number {
  try {
    const start = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    if (Number.isInteger(start)) return start;
  } catch {
    // not Linux
  }
  return 32_768;
}

async function belowEphemeral(bindable: (port: number) => Promise<boolean>, kernelsChoice: () => Promise<number>): Promise<number> {
  const end = ephemeralStart();
  // A range widened down to LOWEST leaves nothing below it: the kernel's choice, with its race.
  if (end - LOWEST < 1_000) return kernelsChoice();
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = LOWEST + Math.floor(Math.random() * (end - LOWEST));
    if (await bindable(port)) return port;
  }
  return kernelsChoice();
}

function tcpBindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
  });
}

function udpBindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = createSocket('udp4');
    socket.once('error', () => resolve(false));
    socket.bind(port, '127.0.0.1', () => socket.close(() => resolve(true)));
  });
}

function kernelsTcpPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

function kernelsUdpPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const socket = createSocket('udp4');
    socket.once('error', reject);
    socket.bind(0, '127.0.0.1', () => {
      const { port } = socket.address();
      socket.close(() => resolve(port));
    });
  });
}

/** A TCP port on 127.0.0.1 that was free a moment ago and that no listen(0) or connect() will take. */
export function freePort(): Promise<number> {
  return belowEphemeral(tcpBindable, kernelsTcpPort);
}

/** A UDP port on 127.0.0.1 that was free a moment ago and that no bind(0) will take. */
export function freeUdpPort(): Promise<number> {
  return belowEphemeral(udpBindable, kernelsUdpPort);
}
