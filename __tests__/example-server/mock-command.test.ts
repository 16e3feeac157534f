import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { parseMockCommandLine } from '../../example-server/mock-vllm/command';

const ROOT = join(__dirname, '..', '..');

describe('the standalone mock vLLM command', () => {
  it('reads its flags', () => {
    expect(parseMockCommandLine([])).toEqual({ port: 8000, dataParallelSize: 4, startRank: 0 });
    expect(parseMockCommandLine(['--port=9000', '--dp-size', '8', '--model', 'llama', '--decode-ms', '5', '--host', '::1'])).toEqual({
      port: 9000,
      host: '::1',
      dataParallelSize: 8,
      startRank: 0,
      model: 'llama',
      decodeMsPerToken: 5,
    });
    expect(() => parseMockCommandLine(['--bogus'])).toThrow('unknown option "--bogus"');
  });

  // The load-balancing mode as vLLM 52a31cc decides it from the same flags
  // (vllm/engine/arg_utils.py:1854-1912): the engines the API server manages.
  it.each([
    ['internal LB', ['--data-parallel-size', '8'], { dataParallelSize: 8, startRank: 0 }],
    ['a hybrid node, inferred from its start rank', ['--data-parallel-size', '8', '--data-parallel-size-local', '4', '--data-parallel-start-rank', '4'], { dataParallelSize: 4, startRank: 4 }],
    ['a hybrid node at start rank 0', ['--dp-size', '8', '--dp-size-local', '4', '--data-parallel-hybrid-lb'], { dataParallelSize: 4, startRank: 0 }],
    ['an internal-LB head with local engines only (it runs them all)', ['--dp-size', '8', '--dp-size-local', '4'], { dataParallelSize: 8, startRank: 0 }],
    ['hybrid with one local engine, which vLLM turns into external LB', ['--dp-size', '4', '--dp-size-local', '1', '--start-rank', '2'], { dataParallelSize: 1, startRank: 2 }],
    ['external LB', ['--data-parallel-size', '4', '--data-parallel-rank', '3'], { dataParallelSize: 1, startRank: 3 }],
  ])('reads %s', (_label, argv, expected) => {
    expect(parseMockCommandLine(argv)).toMatchObject(expected);
  });

  it.each([
    [['--dp-size', '8', '--start-rank', '8'], '--data-parallel-start-rank needs --data-parallel-size-local'],
    [['--data-parallel-hybrid-lb'], '--data-parallel-hybrid-lb needs --data-parallel-size-local'],
    [['--data-parallel-external-lb'], '--data-parallel-external-lb needs --data-parallel-rank R'],
    [['--data-parallel-rank', '4'], '--data-parallel-rank 4 is not below --data-parallel-size 4'],
    [['--dp-size', '8', '--dp-size-local', '4', '--start-rank', '6'], 'passes --data-parallel-size 8'],
    [['--data-parallel-hybrid-lb=1'], '--data-parallel-hybrid-lb is a switch'],
  ])('refuses %j', (argv, message) => {
    expect(() => parseMockCommandLine(argv)).toThrow(message);
  });

  it('reads its other flags', () => {
    expect(parseMockCommandLine(['--kv-events-port', '5557', '--host', '0.0.0.0'])).toMatchObject({ kvEvents: { host: '0.0.0.0', port: 5557, replayPort: 6557 } });
    expect(parseMockCommandLine(['--help'])).toBe('help');
    expect(() => parseMockCommandLine(['--port', 'x'])).toThrow('--port must be an integer from 0 to 65535, got "x"');
    expect(() => parseMockCommandLine(['--model='])).toThrow('--model needs a value');
  });

  it('reads its timing flags into the timed engine and the CPU tier, refusing what does not fit', () => {
    expect(parseMockCommandLine(['--dp-size', '4', '--speeds', '1,1,0.5,0.5', '--step-ms', '20', '--cpu-blocks', '1000', '--kv-events-port', '5557'])).toMatchObject({
      scheduler: { speeds: [1, 1, 0.5, 0.5], stepMs: 20 },
      cpuBlocksPerRank: 1000,
    });
    expect(parseMockCommandLine(['--speeds', '0.5'])).toMatchObject({ scheduler: { speeds: 0.5 } });
    expect(parseMockCommandLine(['--step-ms', '30'])).toMatchObject({ scheduler: { stepMs: 30 } });
    expect(parseMockCommandLine([])).not.toHaveProperty('scheduler');
    expect(() => parseMockCommandLine(['--dp-size', '4', '--speeds', '1,0.5'])).toThrow('--speeds gives 2 speeds for 4 ranks');
    expect(() => parseMockCommandLine(['--speeds', '1,-1,1,1'])).toThrow('--speeds must be relative speeds above 0');
    expect(() => parseMockCommandLine(['--cpu-blocks', '100'])).toThrow('--cpu-blocks keeps token blocks, which needs the tokenizer of --kv-events-port');
    expect(() => parseMockCommandLine(['--speeds', '1', '--decode-ms', '5'])).toThrow('give one or the other');
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
          const match = /^mock vLLM listening on (http:\/\/127\.0\.0\.1:\d+): model tiny, ranks 0-1 \(X-data-parallel-rank 0-1\)\n/.exec(out);
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
