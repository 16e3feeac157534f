/**
 * The benchmark's upstream: a minimal node:http server standing in for vLLM. It drains the
 * request body and answers a small completion-shaped JSON, echoing the rank header it
 * received in `x-echo-rank`: the plain value when exactly one line arrived, `none` when
 * none did, `multi:<n>` when several did. The load generator checks that value per response.
 *
 * Run as a child: prints `READY <port>`.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

const RANK_HEADER = 'x-data-parallel-rank';
const BODY = Buffer.from('{"id":"cmpl-bench","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}]}');
const BODY_LENGTH = String(BODY.length);

function echoedRank(rawHeaders: readonly string[]): string {
  let value: string | undefined;
  let count = 0;
  for (let index = 0; index < rawHeaders.length; index += 2) {
    const name = rawHeaders[index];
    if (name.length === RANK_HEADER.length && name.toLowerCase() === RANK_HEADER) {
      count++;
      value = rawHeaders[index + 1];
    }
  }
  if (count === 0) return 'none';
  if (count > 1) return `multi:${count}`;
  return value!;
}

const server = createServer((req, res) => {
  const rank = echoedRank(req.rawHeaders);
  req.on('data', noop);
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': BODY_LENGTH, 'x-echo-rank': rank });
    res.end(BODY);
  });
});
function noop(): void {}
// Longer than any client agent's idle timeout, so the server never closes a pooled socket first.
server.keepAliveTimeout = 60_000;
server.headersTimeout = 65_000;
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  process.stdout.write(`READY ${(server.address() as AddressInfo).port}\n`);
});
process.on('SIGTERM', () => process.exit(0));
// The parent may go away first (Ctrl-C, a failed start): a closed pipe is no reason to crash.
process.stdout.on('error', () => undefined);
