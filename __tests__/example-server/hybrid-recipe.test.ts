/**
 * The README's hybrid load-balancing recipe, run as written: two mock vLLM nodes started with
 * `vllm serve`'s own data-parallel flags (`npm run mock -- …`) and `npm start -- --upstream
 * URL@0-3 --upstream URL@4-7` in front, as processes on loopback. vLLM 52a31cc reads the rank
 * header as an index from 0 into a node's engines (vllm/v1/engine/input_processor.py:252-259),
 * so every global rank must reach its engine with the gateway's defaults.
 */
import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { runCommand } from '../helpers';
import { expressMajor } from '../helpers/app';

const ROOT = join(__dirname, '..', '..');

/** The three command lines of the README's hybrid block, `&` dropped. */
function recipe(): string[][] {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('### Hybrid and external load balancing'));
  const block = /```sh\n([^]*?)```/.exec(section)![1];
  return block
    .trim()
    .split('\n')
    .map((line) => line.replace(/\s*&$/, '').split(/\s+/));
}

const MOCK = /mock vLLM listening on (http:\/\/127\.0\.0\.1:\d+)/;
const GATEWAY = /express-dp-router listening on (http:\/\/127\.0\.0\.1:\d+)/;

/** A chat completion through the gateway; the engine that served it, and the answer's text. */
async function chat(gateway: string, headers: Record<string, string>, stream = false): Promise<{ status: number; engine: string | null; text: string }> {
  const response = await fetch(`${gateway}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, stream }),
  });
  return { status: response.status, engine: response.headers.get('x-mock-rank'), text: await response.text() };
}

// The child processes load express 5 whatever the jest project maps `express` to: run them once.
const describeProcess = expressMajor === 4 ? describe.skip : describe;

describeProcess("the README's hybrid recipe, as processes", () => {
  it('serves every global rank on its own engine with the default rank header', async () => {
    const [nodeA, nodeB, gateway] = recipe();
    expect(nodeA.slice(0, 4)).toEqual(['npm', 'run', 'mock', '--']);
    expect(gateway.slice(0, 3)).toEqual(['npm', 'start', '--']);
    const portOf = (line: string[]) => line[line.indexOf('--port') + 1];
    const withPort = (line: string[], port: string) => line.map((arg, index) => (line[index - 1] === '--port' ? port : arg));
    const stops: Array<() => Promise<void>> = [];
    try {
      const a = await runCommand(withPort(nodeA, '0'), MOCK);
      stops.push(a.stop);
      const b = await runCommand(withPort(nodeB, '0'), MOCK);
      stops.push(b.stop);
      const urls = gateway.map((arg) => arg.replace(`127.0.0.1:${portOf(nodeA)}`, a.url.slice(7)).replace(`127.0.0.1:${portOf(nodeB)}`, b.url.slice(7)));
      const front = await runCommand([...urls.slice(0, 3), '--port', '0', ...urls.slice(3)], GATEWAY);
      stops.push(front.stop);
      for (let rank = 0; rank < 8; rank++) {
        const answer = await chat(front.url, { 'x-data-parallel-rank': String(rank) });
        expect([answer.status, answer.engine]).toEqual([200, String(rank)]);
      }
      const streamed = await chat(front.url, { 'x-data-parallel-rank': '6' }, true);
      expect([streamed.status, streamed.engine]).toEqual([200, '6']);
      expect(streamed.text).not.toContain('"error"');
      expect(streamed.text.endsWith('data: [DONE]\n\n')).toBe(true);
    } finally {
      await Promise.all(stops.map((stop) => stop()));
    }
  }, 90_000);

  it('answers 200 from `npm start -- --upstream URL@4-7` in front of a node at start rank 4 with 4 local engines', async () => {
    const stops: Array<() => Promise<void>> = [];
    try {
      // Tokens a second apart, so that four requests at once are all in flight and spread over the four engines.
      const node = await runCommand(
        ['npm', 'run', 'mock', '--', '--port', '0', '--data-parallel-size', '8', '--data-parallel-size-local', '4', '--data-parallel-start-rank', '4', '--decode-ms', '250'],
        MOCK,
      );
      stops.push(node.stop);
      const gateway = await runCommand(['npm', 'start', '--', '--port', '0', '--upstream', `${node.url}@4-7`], GATEWAY);
      stops.push(gateway.stop);
      const answers = await Promise.all([false, true, false, true].map((stream) => chat(gateway.url, {}, stream)));
      for (const answer of answers) {
        expect(answer.status).toBe(200);
        expect(answer.text).not.toContain('out of range');
      }
      expect(answers.map((answer) => answer.engine).sort()).toEqual(['4', '5', '6', '7']);
      expect(JSON.parse(answers[0].text).choices[0].message.content).toMatch(/^rank [4-7]:/);
    } finally {
      await Promise.all(stops.map((stop) => stop()));
    }
  }, 90_000);
});
