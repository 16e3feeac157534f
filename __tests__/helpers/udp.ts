import { createSocket } from 'node:dgram';

/**
 * A UDP port on 127.0.0.1 that was free a moment ago, for replicas that must know each other's
 * before they start (bench/lib/udp-port.ts re-exports it: tests import nothing from bench/).
 */
export function freeUdpPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const socket = createSocket('udp4');
    socket.once('error', reject);
    socket.bind(0, '127.0.0.1', () => {
      const { port } = socket.address();
      socket.close(() => resolve(port));
    });
  });
}

/** Sends each datagram to 127.0.0.1:`port` from a socket of its own, and resolves once all are sent. */
export async function sendDatagrams(port: number, datagrams: readonly Buffer[]): Promise<void> {
  const socket = createSocket('udp4');
  try {
    for (const datagram of datagrams) await new Promise<void>((resolve, reject) => socket.send(datagram, port, '127.0.0.1', (error) => (error ? reject(error) : resolve())));
  } finally {
    socket.close();
  }
}
