import { describe, expect, it } from '@jest/globals';
import { decodeBody, mooncakeDecodeParams, mooncakePrefillParams, NIXL_PREFILL_PARAMS, prefillBody, transferParamsOf } from '../../lib/disaggregation/leg-bodies';
import { parseBootstrapQuery } from '../../lib/disaggregation/mooncake';

const bytes = (text: string) => Buffer.from(text);
const json = (buffer: Buffer | undefined) => JSON.parse(buffer!.toString('utf8')) as Record<string, unknown>;
const NIXL = JSON.parse(NIXL_PREFILL_PARAMS) as unknown;

describe('prefillBody', () => {
  it.each([
    ['a streamed chat', '{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":64}'],
    ['a completion', '{"model":"m","prompt":"hello","max_tokens":32,"min_tokens":8,"temperature":0}'],
    ['a body with the params first', '{"kv_transfer_params":{"remote_host":"evil"},"prompt":"x"}'],
    ['a body with only fields replaced', '{ "stream" : true , "max_tokens": 4 }'],
    ['an empty object', '{}'],
  ])('rewrites %s to a one-token, unstreamed prefill request', (_label, text) => {
    const body = json(prefillBody(bytes(text), NIXL_PREFILL_PARAMS));
    const original = JSON.parse(text) as Record<string, unknown>;
    expect(body.kv_transfer_params).toEqual(NIXL);
    expect(body.stream).toBe(false);
    expect(body.max_tokens).toBe(1);
    expect('stream_options' in body).toBe(false);
    if ('max_completion_tokens' in original) expect(body.max_completion_tokens).toBe(1);
    else expect('max_completion_tokens' in body).toBe(false);
    if ('min_tokens' in original) expect(body.min_tokens).toBe(1);
    for (const [key, value] of Object.entries(original)) {
      if (!['kv_transfer_params', 'stream', 'stream_options', 'max_tokens', 'max_completion_tokens', 'min_tokens'].includes(key)) expect(body[key]).toEqual(value);
    }
  });

  it('keeps a min_tokens of 0 or 1 as written, and leaves no member twice', () => {
    const out = prefillBody(bytes('{"prompt":"x","min_tokens":0,"max_tokens":9,"max_tokens":10}'), NIXL_PREFILL_PARAMS)!.toString();
    expect(out.match(/"max_tokens"/g)).toHaveLength(1);
    expect(json(Buffer.from(out)).min_tokens).toBe(0);
  });

  it('carries the prefill rank in the hint field', () => {
    const out = json(prefillBody(bytes('{"prompt":"x","data_parallel_rank":3}'), NIXL_PREFILL_PARAMS, { name: Buffer.from('data_parallel_rank'), value: '5' }));
    expect(out.data_parallel_rank).toBe(5);
  });

  it('refuses what is not one JSON object', () => {
    expect(prefillBody(bytes('[1,2]'), NIXL_PREFILL_PARAMS)).toBeUndefined();
    expect(prefillBody(bytes('{"prompt":'), NIXL_PREFILL_PARAMS)).toBeUndefined();
  });

  it('gives Mooncake prefills their transfer id', () => {
    expect(json(prefillBody(bytes('{"prompt":"x"}'), mooncakePrefillParams('xfer-1'))).kv_transfer_params).toEqual({ do_remote_decode: true, do_remote_prefill: false, transfer_id: 'xfer-1' });
    // What vLLM 52a31cc's own proxy sends (examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py:299-305).
    expect(JSON.parse(mooncakeDecodeParams('xfer-1', 'http://h:8998', 'e0'))).toEqual({
      do_remote_decode: false,
      do_remote_prefill: true,
      remote_bootstrap_addr: 'http://h:8998',
      remote_engine_id: 'e0',
      transfer_id: 'xfer-1',
    });
  });
});

describe('decodeBody', () => {
  const client = '{"model":"m",\n  "prompt": "caf\u00e9 \\u00e9",  "max_tokens":7, "stream":true}';

  it('is the client body byte for byte when there is nothing to carry', () => {
    const original = bytes(client);
    expect(decodeBody(original, undefined)!.equals(original)).toBe(true);
  });

  it('adds the prefill params verbatim and keeps every other byte', () => {
    const params = '{"do_remote_prefill":true, "remote_block_ids":[1,2],"remote_engine_id":"e","x":1.50}';
    const out = decodeBody(bytes(client), params)!.toString();
    expect(out).toBe(`${client.slice(0, -1)},"kv_transfer_params":${params}}`);
  });

  it.each([
    ['first', '{"kv_transfer_params":{"remote_host":"10.0.0.1"},"prompt":"x"}', '{"prompt":"x"}'],
    ['last', '{"prompt":"x", "kv_transfer_params":{"remote_host":"10.0.0.1"}}', '{"prompt":"x"}'],
    ['alone', '{ "kv_transfer_params" : null }', '{}'],
    ['twice', '{"kv_transfer_params":1,"prompt":"x","kv_transfer_params":2,"n":1}', '{"prompt":"x","n":1}'],
  ])("drops the client's own params (%s)", (_label, text, expected) => {
    expect(decodeBody(bytes(text), undefined)!.toString()).toBe(expected);
  });
});

describe('transferParamsOf', () => {
  it('reads the top-level object as written', () => {
    const params = '{"remote_block_ids":[[1,2],[3]],"remote_engine_id":"e","tp_size":1}';
    expect(transferParamsOf(bytes(`{"id":"c","choices":[{"kv_transfer_params":1}],"kv_transfer_params":${params}}`))).toBe(params);
  });

  it.each([['absent', '{"id":"c"}'], ['null', '{"kv_transfer_params":null}'], ['empty', '{"kv_transfer_params": { } }'], ['a string', '{"kv_transfer_params":"x"}'], ['not JSON', 'upstream error'], ['an array', '[]']])(
    'finds none when %s',
    (_label, text) => {
      expect(transferParamsOf(bytes(text))).toBeUndefined();
    },
  );
});

describe('parseBootstrapQuery', () => {
  it('reads the current connector’s shape and the older proxy’s', () => {
    expect(parseBootstrapQuery('{"0":{"engine_id":"a","worker_addr":{}},"1":{"engine_id":"b"}}')).toEqual(new Map([[0, 'a'], [1, 'b']]));
    expect(parseBootstrapQuery('{"a":{"0":{},"1":{}},"b":{"2":{}}}')).toEqual(new Map([[0, 'a'], [1, 'a'], [2, 'b']]));
  });

  it('refuses anything else', () => {
    for (const text of ['[]', 'x', '{"0":"a"}', '{"e":{"-1":{}}}']) expect(parseBootstrapQuery(text)).toBeUndefined();
  });
});
