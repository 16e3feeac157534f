import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from '@jest/globals';
import { TokenizerAgreement } from '../../../lib/exact-prefix/tokenizer/tokenizer-agreement';

let server: Server | undefined;
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise((resolve) => server?.close(resolve));
});

describe('TokenizerAgreement against a trickling /tokenize', () => {
  it('drops a check at its deadline even while bytes keep coming, and frees the slot (item 22.12)', async () => {
    let calls = 0;
    server = createServer((_req, res) => {
      calls++;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"tokens":[');
      // One byte every 50 ms: never idle long enough for a socket timeout.
      const timer = setInterval(() => res.write(' '), 50);
      res.on('close', () => clearInterval(timer));
    });
    await new Promise<void>((resolve) => (server as Server).listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    const errors: string[] = [];
    const agreement = new TokenizerAgreement({ url: `http://127.0.0.1:${port}`, timeoutMs: 300, minIntervalMs: 0, sampleRate: 1, onError: (reason) => errors.push(reason) });
    const started = Date.now();
    await expect(agreement.check('completions', { prompt: 'hello' }, [1])).resolves.toBeUndefined();
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(errors[0]).toMatch(/timed out after 300 ms/);
    // The slot is free: the next offer checks again.
    agreement.offer('completions', { prompt: 'again' }, [1]);
    expect(calls).toBeGreaterThanOrEqual(1);
    agreement.close();
  });
});
