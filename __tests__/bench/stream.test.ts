/**
 * Smoke test of `npm run bench:stream`: one tiny block through a contender of each kind the
 * benchmark compares (the plain proxy, a policy, admission with a token budget, exact routing,
 * P/D), and a few streams held open for the memory figure, run as the real subprocess tree. It
 * checks correctness only, never timing: every stream through every contender delivered every
 * chunk, its usage chunk and `[DONE]`, and every held stream opened.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from '@jest/globals';
import { runBench } from './cli';

const CONTENDERS = ['baseline', 'router:round-robin', 'router:least-outstanding+tokens', 'router:prefix-aware+exact', 'router:least-outstanding+pd'];

interface Row {
  contender: string;
  failedStreams: number;
  held: number;
  cpuUsPerChunk: number;
}

describe('bench:stream', () => {
  it('streams through every contender without losing a chunk, and holds streams open for the memory figure', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dp-router-stream-'));
    const out = join(dir, 'stream.json');
    try {
      const args = ['--contenders', CONTENDERS.join(','), '--streams', '2', '--chunks', '20', '--chunk-ms', '2', '--blocks', '1', '--open', '20', '--memory', 'baseline,router:round-robin', '--out', out];
      const run = await runBench('bench/stream/main.ts', args, 170_000);
      if (run.code !== 0) throw new Error(`bench:stream exited with ${run.code}\n${run.stderr}`);
      const { rows } = JSON.parse(readFileSync(out, 'utf8')) as { rows: Row[] };
      expect(rows.map((row) => row.contender)).toEqual(CONTENDERS);
      for (const row of rows) {
        expect({ contender: row.contender, failed: row.failedStreams }).toEqual({ contender: row.contender, failed: 0 });
        expect(Number.isFinite(row.cpuUsPerChunk)).toBe(true);
      }
      expect(rows.filter((row) => row.held > 0).map((row) => [row.contender, row.held])).toEqual([
        ['baseline', 20],
        ['router:round-robin', 20],
      ]);
      for (const contender of CONTENDERS) expect(run.stdout).toContain(`| ${contender} |`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 180_000);
});
