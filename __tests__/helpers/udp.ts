import { createSocket } from 'node:dgram';

/** Sends each datagram to 127.0.0.1:`port` from a socket of its own, and resolves once all are sent. */
export async function sendDatagrams(port: number, datagrams: readonly Buffer[]): Promise<void> {
  const socket = createSocket('udp4');
  try {
    for (const datagram of datagrams) await new Promise<void>((resolve, reject) => socket.send(datagram, port, '127.0.0.1', (error) => (error ? reject(error) : resolve())));
  } finally {
    socket.close();
  }
}
