import { describe, expect, it } from '@jest/globals';
import { IncomingMessage } from 'node:http';
import { Socket } from 'node:net';
import { unrelayable } from '../../lib/forward/upstream-response';

/** An answer as Node's client would hand it over, built from its parts. */
function answer(statusCode: number, statusMessage: string, rawHeaders: string[] = []): IncomingMessage {
  const message = new IncomingMessage(new Socket());
  message.statusCode = statusCode;
  message.statusMessage = statusMessage;
  message.rawHeaders = rawHeaders;
  const headers: Record<string, string> = {};
  for (let index = 0; index < rawHeaders.length; index += 2) headers[rawHeaders[index].toLowerCase()] = rawHeaders[index + 1];
  message.headers = headers;
  return message;
}

describe('unrelayable', () => {
  it.each([0, 99, 101, 199, 1000])('refuses status %d', (status) => {
    expect(unrelayable(answer(status, 'X'), false)).toBe(`answered with status ${status}`);
  });

  it.each([200, 204, 404, 503, 999])('relays status %d', (status) => {
    expect(unrelayable(answer(status, 'X'), false)).toBeUndefined();
  });

  it('drops a reason phrase Node would refuse and keeps a Latin-1 one', () => {
    const bad = answer(200, 'O\x01K');
    expect(unrelayable(bad, false)).toBeUndefined();
    expect(bad.statusMessage).toBe('');
    const latin = answer(200, 'Ä\tK');
    unrelayable(latin, false);
    expect(latin.statusMessage).toBe('Ä\tK');
  });

  it.each([
    ['chunked', undefined],
    ['CHUNKED', undefined],
    ['gzip', "used Transfer-Encoding 'gzip'"],
    ['chunked, chunked', "used Transfer-Encoding 'chunked, chunked'"],
    ['\x1b[31m', "used Transfer-Encoding '\\u001b[31m'"],
  ])('Transfer-Encoding %j', (coding, expected) => {
    expect(unrelayable(answer(200, 'OK', ['Transfer-Encoding', coding]), false)).toBe(expected);
  });

  it('checks every header only when asked (a lenient parser let them through)', () => {
    for (const raw of [['X A', 'v'], ['X-A', 'a\x01b'], ['X-A', 'a\x7fb']]) {
      expect(unrelayable(answer(200, 'OK', raw), false)).toBeUndefined();
      expect(unrelayable(answer(200, 'OK', raw), true)).toBe('sent a header Node cannot forward');
    }
    expect(unrelayable(answer(200, 'OK', ['X-A', 'a\xffb']), true)).toBeUndefined();
  });
});
