import { describe, expect, it } from '@jest/globals';
import type { IncomingHttpHeaders } from 'node:http';
import { hopByHopStripper, nominated, withoutNomination } from '../../lib/http/hop-by-hop';

describe('hopByHopStripper', () => {
  const strip = hopByHopStripper(['X-data-parallel-rank']);

  it('removes the RFC 9110 hop-by-hop headers and those the Connection header names', () => {
    const headers: IncomingHttpHeaders = {
      connection: 'close, X-Secret,  x-other ',
      'x-secret': 's',
      'x-other': 'o',
      'keep-alive': 'timeout=5',
      'proxy-connection': 'keep-alive',
      te: 'trailers',
      trailer: 'x-t',
      upgrade: 'websocket',
      'proxy-authorization': 'Basic eDp5',
      'proxy-authenticate': 'Basic',
      'content-type': 'application/json',
    };
    strip(headers);
    expect(headers).toEqual({ 'content-type': 'application/json' });
  });

  it("'unset' leaves each removed name undefined (for http-proxy to skip), not deleted", () => {
    const headers: IncomingHttpHeaders = { connection: 'keep-alive, x-internal', 'x-internal': 'i', 'keep-alive': 'timeout=5', 'content-type': 'text/plain' };
    hopByHopStripper([], 'any', 'unset')(headers);
    expect(Object.keys(headers)).toEqual(['connection', 'x-internal', 'keep-alive', 'content-type']);
    expect(headers).toStrictEqual({ connection: 'keep-alive, x-internal', 'x-internal': undefined, 'keep-alive': undefined, 'content-type': 'text/plain' });
  });

  it('never removes framing, Host or the headers it was told to keep, even when nominated', () => {
    const headers: IncomingHttpHeaders = {
      connection: 'transfer-encoding, Content-Length, host, x-data-parallel-rank',
      'transfer-encoding': 'chunked',
      'content-length': '2',
      host: 'h',
      'x-data-parallel-rank': '3',
    };
    strip(headers);
    expect(headers).toEqual({ 'transfer-encoding': 'chunked', 'content-length': '2', host: 'h', 'x-data-parallel-rank': '3' });
  });

  it.each(['keep-alive', 'close'])('Connection: %s alone removes only itself', (value) => {
    const headers: IncomingHttpHeaders = { connection: value, accept: '*/*' };
    strip(headers);
    expect(headers).toEqual({ accept: '*/*' });
  });
});

describe('nominated', () => {
  it('lower-cases, trims and skips empty list members', () => {
    expect(nominated(' Close ,, X-A,x-b ')).toEqual(['close', 'x-a', 'x-b']);
  });
});

describe('withoutNomination', () => {
  it.each([
    ['close, X-data-parallel-rank', 'close'],
    ['X-Data-Parallel-Rank , close', 'close'],
    ['a, x-data-parallel-rank, b', 'a, b'],
    ['x-data-parallel-rank', undefined],
    ['close, x-data-parallel-rank-extra', 'close, x-data-parallel-rank-extra'],
    ['keep-alive', 'keep-alive'],
  ])('%j → %j', (value, expected) => {
    expect(withoutNomination(value, 'X-data-parallel-rank')).toBe(expected);
  });
});
