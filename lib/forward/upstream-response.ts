import type { IncomingMessage } from 'node:http';

/** What Node's server refuses in a status message or header value (`checkInvalidHeaderChar`). */
const INVALID_FIELD_CHAR = /[^\t\x20-\x7e\x80-\xff]/;
/** What Node's server refuses in a header name (`checkIsHttpToken`). */
const HTTP_TOKEN = /^[\^_`a-zA-Z\-0-9!#$%&'*+.|~]+$/;

/**
 * Whether this process parses HTTP leniently (`--insecure-http-parser`), letting through
 * header names and values that Node's server refuses to write. The strict parser, the
 * default, rejects them itself as an error before any response, so only a lenient process
 * needs every header checked.
 */
export function lenientParser(): boolean {
  return [...process.execArgv, ...(process.env.NODE_OPTIONS ?? '').split(/\s+/)].includes('--insecure-http-parser');
}

/**
 * Why the gateway cannot relay this upstream answer faithfully, or `undefined` when it can.
 * Repairs what it can instead: a reason phrase Node's server would refuse is dropped, and the
 * status is sent with its standard phrase (the phrase carries no meaning in HTTP/1.1).
 */
export function unrelayable(answer: IncomingMessage, checkHeaders: boolean): string | undefined {
  const status = answer.statusCode ?? 0;
  // Node's client consumes 1xx answers except 101; a 101 to a request that asked for no
  // upgrade (the gateway strips `Upgrade`) cannot be answered to the client as HTTP.
  if (status < 200 || status > 999) return `answered with status ${status}`;
  if (INVALID_FIELD_CHAR.test(answer.statusMessage ?? '')) answer.statusMessage = '';
  const coding = answer.headers['transfer-encoding'];
  // Node's client removes only `chunked` framing: any other coding would reach the client
  // undecoded and unlabelled, or (with no `chunked` at all) unframed on a kept-alive connection.
  if (coding !== undefined && coding !== 'chunked' && coding.toLowerCase() !== 'chunked') return `used Transfer-Encoding '${printable(coding)}'`;
  if (checkHeaders) {
    const raw = answer.rawHeaders;
    for (let index = 0; index < raw.length; index += 2) {
      if (!HTTP_TOKEN.test(raw[index]) || INVALID_FIELD_CHAR.test(raw[index + 1])) return 'sent a header Node cannot forward';
    }
  }
  return undefined;
}

/** An upstream value fit for a message: control characters escaped, length bounded. */
function printable(value: string): string {
  return JSON.stringify(value.slice(0, 40)).slice(1, -1);
}
