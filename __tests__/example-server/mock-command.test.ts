import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { parseMockCommandLine } from '../../example-server/mock-vllm/command';

const ROOT = join(__dirname, '..', '..');

describe('the standalone mock vLLM command', () => {
  it('reads its flags', () => {
    expect(parseMockCommandLine([])).toEqual({ port: 8000 });
    expect(parseMockCommandLine(['--port=9000', '--dp-size', '8', '--start-rank', '8', '--model', 'llama', '--decode-ms', '5', '--host', '::1'])).toEqual({
      port: 9000,
      host: '::1',
      dataParallelSize: 8,
      startRank: 8,
      model: 'llama',
      decodeMsPerToken: 5,
    });
    expect(parseMockCommandLine(['--kv-events-port', '5557', '--host', '0.0.0.0'])).toMatchObject({ kvEvents: { host: '0.0.0.0', port: 5557, replayPort: 6557 } });
    expect(parseMockCommandLine(['--help'])).toBe('help');
    expect(() => parseMockCommandLine(['--port', 'x'])).toThrow('--port must be an integer from 0 to 65535, got "x"');
    expect(() => parseMockCommandLine(['--model='])).toThrow('--model needs a value');
    expect(() => parseMockCommandLine(['--bogus'])).toThrow('unknown option "--bogus"');
  });

  it('exits 1 with one line naming its port and --port when the port is taken', async () => {
    const holder = createServer();
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
    const { port } = holder.address() as AddressInfo;
    try {
      const child = spawn(join(ROOT, 'node_modules', '.bin', 'tsx'), [join(ROOT, 'example-server', 'mock-vllm.ts'), '--port', String(port)], { cwd: ROOT });
      let stderr = '';
      child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
      const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
      expect(code).toBe(1);
      expect(stderr.trim().split('\n')).toEqual([`mock-vllm: the mock vLLM cannot listen on 127.0.0.1:${port}: another process holds that port (EADDRINUSE); give --port N (0: any free one)`]);
    } finally {
      await new Promise((resolve) => holder.close(resolve));
    }
  });

  it('runs as `npx tsx example-server/mock-vllm.ts --port N` and serves until SIGTERM', async () => {
    const child = spawn(join(ROOT, 'node_modules', '.bin', 'tsx'), [join(ROOT, 'example-server', 'mock-vllm.ts'), '--port', '0', '--dp-size', '2', '--model', 'tiny'], { cwd: ROOT });
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve));
    try {
      const url = await new Promise<string>((resolve, reject) => {
        let out = '';
        child.stdout.on('data', (chunk: Buffer) => {
          out += chunk.toString();
          const match = /^mock vLLM listening on (http:\/\/127\.0\.0\.1:\d+): model tiny, ranks 0-1\n/.exec(out);
          if (match) resolve(match[1]);
        });
        child.on('close', () => reject(new Error(`exited before listening: ${out}`)));
      });
      const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: Array<{ id: string }> };
      expect(models.data.map((model) => model.id)).toEqual(['tiny']);
      const answer = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-data-parallel-rank': '1' }, body: '{"model":"tiny","prompt":"hi","max_tokens":2}' });
      expect(((await answer.json()) as { choices: Array<{ text: string }> }).choices[0].text).toMatch(/^rank 1:/);
    } finally {
      child.kill('SIGTERM');
    }
    expect(await closed).toBe(0);
  });
});
