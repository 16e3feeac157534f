/**
 * The README's exact prefix routing block, run as written against the standalone mock: `npm run
 * mock -- … --kv-events-port N` publishing KV events as vLLM's --kv-events-config does, and
 * `npm start -- … --kv-events … --tokenizer example-server/mock-vllm/tokenizer` in front, as
 * processes on loopback. Only the ports are moved to free ones.
 */
import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { ephemeralStart, freePort, runCommand, waitFor } from '../helpers';
import { expressMajor } from '../helpers/app';

const ROOT = join(__dirname, '..', '..');

/** The two command lines of the README's block after "Exact prefix routing from KV events", `&` dropped. */
function recipe(): string[][] {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('**Exact prefix routing from KV events.**'));
  const block = /```sh\n([^]*?)```/.exec(section)![1];
  return block
    .trim()
    .split('\n')
    .map((line) => line.replace(/\s*&$/, '').split(/\s+/));
}

/** Whether a TCP port on loopback is free. */
function free(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
  });
}

/** A base port whose four ranks' publishers and replay sockets (base + r, base + 1000 + r) are all free. */
async function kvEventsBase(): Promise<number> {
  for (;;) {
    const base = await freePort();
    if (base + 1003 > 65535) continue;
    // The replay sockets too stay below the ephemeral range, where no connect() can hold them (when freePort found one there).
    if (base < ephemeralStart() && base + 1003 >= ephemeralStart()) continue;
    const ports = [0, 1, 2, 3].flatMap((rank) => [base + rank, base + 1000 + rank]);
    if ((await Promise.all(ports.map(free))).every(Boolean)) return base;
  }
}

// The child processes load express 5 whatever the jest project maps `express` to: run them once.
const describeProcess = expressMajor === 4 ? describe.skip : describe;

describeProcess("the README's exact prefix routing block, as processes", () => {
  it('48.14: routes on the standalone mock\'s KV events with the mock\'s tokenizer, as the README says', async () => {
    const [mockLine, gatewayLine] = recipe();
    expect(mockLine.slice(0, 4)).toEqual(['npm', 'run', 'mock', '--']);
    expect(gatewayLine.slice(0, 3)).toEqual(['npm', 'start', '--']);
    const base = await kvEventsBase();
    const movePorts = (line: string[]) =>
      line.map((arg, index) => (line[index - 1] === '--port' ? '0' : line[index - 1] === '--kv-events-port' ? String(base) : arg.replace(/:5557\b/, `:${base}`).replace(/:6557\b/, `:${base + 1000}`)));
    const stops: Array<() => Promise<void>> = [];
    try {
      const mock = await runCommand(movePorts(mockLine), /mock vLLM listening on (http:\/\/127\.0\.0\.1:\d+)/);
      stops.push(mock.stop);
      const gatewayArgs = movePorts(gatewayLine).map((arg) => arg.replace('http://127.0.0.1:8000', mock.url));
      const gateway = await runCommand([...gatewayArgs.slice(0, 3), '--port', '0', ...gatewayArgs.slice(3)], /express-dp-router listening on (http:\/\/127\.0\.0\.1:\d+)/);
      stops.push(gateway.stop);
      expect(gateway.out()).toContain('policy prefix-aware (exact, on KV events)');
      const decisions: string[] = [];
      await waitFor(
        async () => {
          const answer = await fetch(`${gateway.url}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            // A prompt of several KV blocks, its system part shared by every request.
            body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'system', content: 'You are a helpful assistant. '.repeat(20) }, { role: 'user', content: `q${decisions.length}` }], max_tokens: 1 }),
          });
          expect(answer.status).toBe(200);
          await answer.arrayBuffer();
          decisions.push(answer.headers.get('x-dp-router-decision') ?? '');
          return decisions[decisions.length - 1].endsWith('; index=exact');
        },
        15_000,
        () => `no exact decision in ${JSON.stringify(decisions)}:\n${gateway.out()}`,
        100,
      );
    } finally {
      await Promise.all(stops.map((stop) => stop()));
    }
  }, 90_000);
});
