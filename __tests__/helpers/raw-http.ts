import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';

/**
 * Sends bytes exactly as given (duplicate header lines included) and returns the raw answer.
 * The request should say `Connection: close`; the socket is not half-closed, since Node's
 * server takes a client's FIN as an abort of the pending request.
 */
export function rawRequest(url: string, request: string): Promise<string> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(request));
    let answer = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk) => (answer += chunk));
    socket.on('end', () => resolve(answer));
    socket.on('error', reject);
  });
}

/**
 * The raw answer to a request the server refuses before reading all of it (headers past
 * Node's limit, say), and how the connection closed. Node's server answers and closes with
 * the unread request bytes still in the kernel's buffer, so Linux sends a reset, not a FIN.
 * A Node client before Node 24 still saw a clean end: libuv before 1.52 took a short read
 * plus POLLHUP as EOF and never read the reset. libuv 1.52 (Node 24) reads on and reports
 * ECONNRESET, after the answer. So the answer is collected either way; a reset before any
 * answer still rejects.
 */
export function rawRefusal(url: string, request: string): Promise<{ answer: string; closed: 'end' | 'reset' }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(request));
    let answer = '';
    socket.setEncoding('latin1');
    socket.on('data', (chunk) => (answer += chunk));
    socket.on('end', () => resolve({ answer, closed: 'end' }));
    socket.on('error', (error: NodeJS.ErrnoException) => {
      if (error.code === 'ECONNRESET' && answer !== '') resolve({ answer, closed: 'reset' });
      else reject(error);
    });
  });
}

/** One request as the raw upstream read it: the head (request line and header lines) as sent. */
export interface RawSeen {
  head: string;
}

export interface RawUpstream {
  url: string;
  seen: RawSeen[];
  /** The bytes (latin1) to answer a request with, given its head; the socket is then ended. */
  answer: (head: string) => string | Buffer | Promise<string | Buffer>;
  close(): Promise<void>;
}

/**
 * A `node:net` upstream that answers each request with exactly the bytes `answer` returns
 * (hostile status lines and headers included, which no `node:http` server would write), then
 * ends the connection. It answers once the head has arrived and ignores any body.
 */
export async function startRawUpstream(answer: RawUpstream['answer']): Promise<RawUpstream> {
  const upstream: RawUpstream = { url: '', seen: [], answer, close: async () => undefined };
  const server: Server = createServer((socket) => {
    socket.on('error', () => undefined);
    let head = '';
    socket.setEncoding('latin1');
    const onData = (chunk: string) => {
      head += chunk;
      const end = head.indexOf('\r\n\r\n');
      if (end === -1) return;
      socket.off('data', onData);
      head = head.slice(0, end);
      upstream.seen.push({ head });
      void Promise.resolve(upstream.answer(head)).then((bytes) => {
        socket.end(typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes);
      });
    };
    socket.on('data', onData);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  upstream.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  upstream.close = closerOf(server);
  return upstream;
}

/** Tracks `server`'s connections; the returned `close()` destroys them and waits for the server. */
export function closerOf(server: Server): () => Promise<void> {
  const sockets = new Set<Socket>();
  server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  return () =>
    new Promise<void>((resolve) => {
      for (const socket of sockets) socket.destroy();
      server.close(() => resolve());
    });
}
