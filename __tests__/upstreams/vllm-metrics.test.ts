import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { parseEngineReport } from '../../lib/upstreams/vllm-metrics';
import { fetchText } from '../../lib/upstreams/scrape';

describe('parseEngineReport', () => {
  it('reads engines and queue sizes from vLLM exposition text', () => {
    const report = parseEngineReport(
      [
        '# HELP vllm:num_requests_running Number of requests in model execution batches.',
        '# TYPE vllm:num_requests_running gauge',
        'vllm:num_requests_running{engine="4",model_name="m"} 3.0',
        'vllm:num_requests_running{model_name="m",engine="6"} 1.0',
        'vllm:num_requests_waiting{engine="4",model_name="m"} 2.0',
        'vllm:num_requests_waiting{engine="6",model_name="m"} 0.0 1700000000000',
        'vllm:kv_cache_usage_perc{engine="5",model_name="m"} 0.5',
        'python_gc_objects_collected_total{generation="0"} 1.0',
      ].join('\n'),
    );
    expect(report.engines).toEqual([4, 5, 6]);
    expect(Object.fromEntries(report.load)).toEqual({ 4: { running: 3, waiting: 2 }, 6: { running: 1, waiting: 0 } });
  });

  it('sums several models on one engine', () => {
    const report = parseEngineReport('vllm:num_requests_running{engine="0",model_name="a"} 1\nvllm:num_requests_running{engine="0",model_name="b"} 2\n');
    expect(report.load.get(0)).toEqual({ running: 3, waiting: 0 });
  });

  it.each([
    ['empty', ''],
    ['garbage', '\u0000\u0001{{{}}}\n'],
    ['a negative value', 'vllm:num_requests_running{engine="0"} -5'],
    ['a NaN value', 'vllm:num_requests_running{engine="0"} NaN'],
    ['a non-decimal engine', 'vllm:num_requests_running{engine="+1"} 1'],
    ['a padded engine', 'vllm:num_requests_running{engine="01"} 1'],
    ['an engine label inside another label value', 'vllm:num_requests_running{model_name="x,engine=\\"3\\""} 1'],
  ])('skips %s without throwing', (_label, text) => {
    const report = parseEngineReport(text);
    expect(report.load.size).toBe(0);
  });

  it('stays bounded on a hostile page with a million engines', () => {
    const lines = Array.from({ length: 100_000 }, (_, engine) => `vllm:num_requests_running{engine="${engine}"} 1`).join('\n');
    const report = parseEngineReport(lines);
    expect(report.engines.length).toBeLessThanOrEqual(65_536);
  });
});

describe('against the mock vLLM', () => {
  let mock: MockVllm;
  beforeAll(async () => {
    mock = await startMockVllm({ dataParallelSize: 4, startRank: 4 });
  });
  afterAll(() => mock.close());

  it('discovers the global ranks the server serves from its /metrics', async () => {
    const report = parseEngineReport(await fetchText(`${mock.url}/metrics`, 1000));
    expect(report.engines).toEqual([4, 5, 6, 7]);
    expect([...report.load.values()].every((load) => load.running === 0 && load.waiting === 0)).toBe(true);
  });

  it('rejects a non-200 answer and a silent server', async () => {
    await expect(fetchText(`${mock.url}/nope`, 1000)).rejects.toThrow(/answered 404/);
    mock.fault = { kind: 'stall' };
    try {
      await expect(fetchText(`${mock.url}/metrics`, 100)).rejects.toThrow(/did not answer within 100 ms/);
    } finally {
      mock.fault = undefined;
    }
  });
});
