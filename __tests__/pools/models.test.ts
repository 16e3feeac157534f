import { describe, expect, it } from '@jest/globals';
import { readMaxLora } from '../../lib/pools/lora-metric';
import { LoraPreference } from '../../lib/pools/lora-preference';
import { ModelPools } from '../../lib/pools/model-pools';
import { MAX_MODEL_CARDS, modelListBody, parseModelList } from '../../lib/pools/models';
import { parseUpstreams } from '../../lib/upstreams/upstream-options';

describe('parseModelList', () => {
  it('reads base models and LoRA adapters', () => {
    const cards = parseModelList(JSON.stringify({ object: 'list', data: [{ id: 'llama', parent: null }, { id: 'sql', parent: 'llama', root: '/a/sql' }] }));
    expect(cards?.map(({ id, parent }) => [id, parent])).toEqual([
      ['llama', null],
      ['sql', 'llama'],
    ]);
  });

  it.each([['not json'], ['{"data":{}}'], ['[1,2]'], ['null']])('refuses %s', (text) => {
    expect(parseModelList(text)).toBeUndefined();
  });

  it('skips cards without a usable id, repeats, and anything past the cap', () => {
    const data = [{ id: '' }, { id: 7 }, 'x', null, { id: 'a\nb' }, { id: 'x'.repeat(257) }, { id: 'ok' }, { id: 'ok' }];
    expect(parseModelList(JSON.stringify({ data }))?.map((card) => card.id)).toEqual(['ok']);
    const many = Array.from({ length: MAX_MODEL_CARDS + 10 }, (_, i) => ({ id: `m${i}` }));
    expect(parseModelList(JSON.stringify({ data: many }))).toHaveLength(MAX_MODEL_CARDS);
  });

  it('answers the union once per id, in vLLM shape', () => {
    const body = JSON.parse(modelListBody([...parseModelList('{"data":[{"id":"a","created":1},{"id":"b"}]}')!, ...parseModelList('{"data":[{"id":"a"}]}')!], 99));
    expect(body).toEqual({ object: 'list', data: [{ id: 'a', object: 'model', created: 99 }, { id: 'b', object: 'model', created: 99 }] });
  });
});

describe('readMaxLora', () => {
  it('takes the newest series', () => {
    const text = [
      '# HELP vllm:lora_requests_info Running stats on lora requests.',
      'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} 1.7e9',
      'vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters=""} 1.8e9',
      'vllm:lora_requests_info{max_lora="3",running_lora_adapters="",waiting_lora_adapters=""} 1.75e9',
    ].join('\n');
    expect(readMaxLora(text)).toBe(2);
    expect(readMaxLora('vllm:num_requests_running{engine="0"} 1')).toBeUndefined();
    expect(readMaxLora('vllm:lora_requests_info{max_lora="0"} 5')).toBeUndefined();
  });
});

describe('ModelPools', () => {
  const endpoint = (upstream: string) => ({ upstream });
  const pools = (upstreams: unknown[]) => new ModelPools<{ upstream: string }>(parseUpstreams('upstreams', upstreams));

  it('is inactive when nothing is known or every upstream lists the same models', () => {
    const fleet = pools([{ url: 'http://a:1', name: 'a' }, { url: 'http://b:1', name: 'b' }]);
    expect(fleet.active).toBe(false);
    expect(fleet.listed).toBe(false);
    fleet.learn('a', parseModelList('{"data":[{"id":"m"}]}')!);
    // b says nothing yet: it still serves everything, a serves m only.
    expect(fleet.active).toBe(true);
    fleet.learn('b', parseModelList('{"data":[{"id":"m"}]}')!);
    expect(fleet.active).toBe(false);
    expect(fleet.listed).toBe(true);
  });

  it('splits the healthy endpoints by model, wildcards in every pool, and follows the healthy list', () => {
    const fleet = pools([{ url: 'http://a:1', name: 'a', models: ['x'] }, { url: 'http://b:1', name: 'b', models: ['y'] }, { url: 'http://c:1', name: 'c' }]);
    const [a, b, c] = ['a', 'b', 'c'].map(endpoint);
    expect(fleet.active).toBe(true);
    expect(fleet.candidates('x', [a, b, c])).toEqual([a, c]);
    expect(fleet.candidates('y', [a, b, c])).toEqual([b, c]);
    expect(fleet.candidates('z', [a, b, c])).toEqual([c]);
    expect(fleet.candidates('x', [b])).toEqual([]);
    const strict = pools([{ url: 'http://a:1', name: 'a', models: ['x'] }]);
    expect(strict.candidates('z', [a])).toBeUndefined();
    // Known, but with no healthy endpoint: an empty pool (503), not an unknown model (404).
    expect(strict.candidates('x', [])).toEqual([]);
  });
});

describe('LoraPreference', () => {
  const endpoints = () => [0, 1, 2].map((rank) => ({ rank, load: 0 }));

  it('prefers endpoints holding the adapter, then those with room, within the load slack', () => {
    const [e0, e1, e2] = endpoints();
    const preference = new LoraPreference<{ rank: number; load: number }>(() => 1, 2);
    preference.sent('a', e0);
    expect(preference.prefer('a', [e0, e1, e2])).toEqual([e0]);
    expect(preference.prefer('b', [e0, e1, e2])).toEqual([e1, e2]);
    e0.load = 3;
    expect(preference.prefer('a', [e0, e1, e2])).toEqual([e1, e2]);
    preference.sent('b', e0);
    expect(preference.heldBy(e0)).toEqual(['b']);
    preference.forget([e0]);
    expect(preference.heldBy(e0)).toEqual([]);
  });
});
