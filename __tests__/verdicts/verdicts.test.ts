import type { IncomingMessage } from 'node:http';
import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { unmodelled } from '../../lib/verdicts/modelled';
import { evidenceSource } from '../../lib/verdicts/source';
import { Suspicion, Verdicts } from '../../lib/verdicts/verdicts';
import { metricValue } from '../helpers';

const messages = [{ role: 'user', content: 'hi' }];
const req = (ip: string) => ({ ip, socket: { remoteAddress: '10.9.9.9' } }) as unknown as IncomingMessage;

describe('unmodelled: the one predicate of what is never evidence', () => {
  it.each([
    ['truncate_prompt_tokens', 'completions', { prompt: 'x', truncate_prompt_tokens: 4 }],
    ['cache_salt', 'chat', { messages, cache_salt: 7 }],
    ['add_special_tokens', 'completions', { prompt: 'x', add_special_tokens: false }],
    ['multimodal', 'chat', { messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'image_url', image_url: { url: 'data:,' } }] }] }],
    ['multimodal', 'completions', { prompt: 'x', prompt_embeds: 'AAAA' }],
    ['token_ids', 'completions', { prompt: [1, 2, 3] }],
    ['token_ids', 'completions', { prompt: [[1, 2], [3]] }],
    ['tool_choice_none', 'chat', { messages, tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: 'none' }],
  ] as const)('%s: %j', (reason, kind, body) => {
    expect(unmodelled(kind, body, true)).toBe(reason);
  });

  it('takes a string cache_salt as evidence only where the index keys it as vLLM does, and plain requests always', () => {
    expect(unmodelled('chat', { messages, cache_salt: 'tenant-a' }, true)).toBeUndefined();
    expect(unmodelled('chat', { messages, cache_salt: 'tenant-a' }, false)).toBe('cache_salt');
    expect(unmodelled('completions', { prompt: ['a', 'b'], truncate_prompt_tokens: null }, false)).toBeUndefined();
    expect(unmodelled('chat', { messages, tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: 'auto' }, false)).toBeUndefined();
  });
});

describe('evidenceSource', () => {
  it('is the tenant, else a keyed hash of the credentials (never the secret), else req.ip', () => {
    expect(evidenceSource(req('1.2.3.4'), { authorization: 'Bearer s3cret' }, 'team-a')).toBe('tenant:team-a');
    const keyed = evidenceSource(req('1.2.3.4'), { authorization: 'Bearer s3cret' }, '');
    expect(keyed).toMatch(/^key:[A-Za-z0-9_-]{22}$/);
    expect(keyed).not.toContain('s3cret');
    expect(evidenceSource(req('5.6.7.8'), { authorization: 'Bearer s3cret' }, undefined)).toBe(keyed);
    expect(evidenceSource(req('1.2.3.4'), { 'x-api-key': 's3cret' }, undefined)).not.toBe(keyed);
    // Express's req.ip (which follows `trust proxy`), not the socket's address.
    expect(evidenceSource(req('1.2.3.4'), {}, undefined)).toBe('ip:1.2.3.4');
  });
});

describe('Suspicion', () => {
  it('counts distinct sources, each capped, and remembers a bounded number of them', () => {
    const suspicion = new Suspicion();
    for (let i = 0; i < 100; i++) suspicion.add('one');
    suspicion.add('two');
    expect([suspicion.sources, suspicion.weight(3)]).toEqual([2, 4]);
    for (let i = 0; i < 1000; i++) suspicion.add(`client-${i}`);
    expect(suspicion.sources).toBe(64);
  });
});

describe('Verdicts', () => {
  it('exports every verdict and outcome of each configured upstream at 0, then counts and logs each once', async () => {
    const registry = new Registry();
    const lines: string[] = [];
    const verdicts = new Verdicts({ minSources: 3 }, { registry, prefix: 'dp_router_' }, { info: (_fields, message) => lines.push(message), warn: (message) => lines.push(message) });
    verdicts.track(['a']);
    const text = await registry.metrics();
    for (const verdict of ['rank_header', 'elsewhere', 'misses', 'tokens', 'tokenizer', 'ejection']) {
      for (const outcome of ['taken', 'refused_single_source']) expect(text).toContain(`dp_router_verdicts_total{upstream="a",verdict="${verdict}",outcome="${outcome}"} 0`);
    }
    expect([verdicts.enough(2), verdicts.enough(3)]).toEqual([false, true]);
    verdicts.refused('a', 'misses', { sources: 1 });
    verdicts.refused('a', 'misses', { sources: 1 });
    verdicts.taken('a', 'misses', 'sources', { sources: 3 });
    expect(await metricValue(registry, 'dp_router_verdicts_total', { upstream: 'a', verdict: 'misses', outcome: 'refused_single_source' })).toBe(2);
    expect(await metricValue(registry, 'dp_router_verdicts_total', { upstream: 'a', verdict: 'misses', outcome: 'taken' })).toBe(1);
    expect(lines).toEqual([expect.stringMatching(/verdict 'misses' from 1 source was not taken/), "express-dp-router: upstream 'a': verdict 'misses' taken on evidence from 3 distinct sources."]);
  });
});
