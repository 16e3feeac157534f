import { createSocket } from 'node:dgram';

/** A UDP port on 127.0.0.1 that was free a moment ago, for replicas that must know each other's before they start. */
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
