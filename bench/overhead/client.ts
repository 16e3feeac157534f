import { Agent, request } from 'node:http';
import { completionBody } from './scenario';

/**
 * A keep-alive client that POSTs one completion body to whichever contender it is told. With
 * `BENCH_DISTINCT_TAIL=N` in the environment, the last N characters of each request's prompt
 * are its own (a counter), as a shared prompt followed by a new question would be: a cache of
 * whole prompts then never hits.
 */
export function createPoster(bytes: number) {
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });
  const body = completionBody(bytes, 0);
  const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) };
  const tail = Number(process.env.BENCH_DISTINCT_TAIL ?? 0);
  let sent = 0;
  const bodyOf = (): Buffer => {
    if (!(tail > 0)) return body;
    // Same length: the tail ends before the body's closing `"}`.
    const distinct = Buffer.from(body);
    const words = ` question ${sent++}: what comes next`.padEnd(tail, ' and then');
    distinct.write(words.slice(0, tail), distinct.length - 2 - tail, 'latin1');
    return distinct;
  };
  const send = (port: number) =>
    new Promise<void>((resolve, reject) => {
      const body = bodyOf();
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
