import { connect } from 'node:net';

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
