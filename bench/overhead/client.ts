import { Agent, request } from 'node:http';
import { completionBody } from './scenario';

/** A keep-alive client that POSTs one completion body to whichever contender it is told. */
export function createPoster(bytes: number) {
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });
  const body = completionBody(bytes, 0);
  const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) };
  const send = (port: number) =>
    new Promise<void>((resolve, reject) => {
      const outgoing = request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST', agent, headers }, (response) => {
        response.resume();
        response.on('end', resolve);
      });
      outgoing.on('error', reject);
      outgoing.end(body);
    });
  return {
    send,
    /** Sends `count` requests over 16 concurrent loops; `portFor(turn)` says where each goes. */
    async run(count: number, portFor: (turn: number) => number): Promise<void> {
      let sent = 0;
      await Promise.all(
        Array.from({ length: 16 }, async (_, loop) => {
          for (let turn = loop; sent < count; turn++) {
            sent++;
            await send(portFor(turn));
          }
        }),
      );
    },
    close: () => agent.destroy(),
  };
}
