import { describe, expect, it } from '@jest/globals';
import { extractPrompt } from '../../lib/request/prompt';

describe('extractPrompt', () => {
  it.each<[string, unknown, string | undefined]>([
    ['completions string', { prompt: 'Hello' }, 'Hello'],
    ['completions string batch', { prompt: ['a', 'b'] }, 'a\nb'],
    ['completions token ids', { prompt: [1, 22, 333] }, '1,22,333,'],
    ['completions token id batch', { prompt: [[1, 2], [3]] }, '1,2,\n3,'],
    ['empty prompt string', { prompt: '' }, ''],
    ['empty prompt array', { prompt: [] }, undefined],
    ['prompt of non-strings', { prompt: [{}, null, true] }, undefined],
    ['prompt object', { prompt: { text: 'x' } }, undefined],
    ['chat string content', { messages: [{ role: 'system', content: 'S' }, { role: 'user', content: 'U' }] }, 'system\nS\nuser\nU\n'],
    [
      'chat content parts',
      { messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'image_url', image_url: { url: 'x' } }, { type: 'text', text: 'b' }] }] },
      'user\na\nb\n',
    ],
    ['single text part reads like a string', { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] }, 'user\nhi\n'],
    ['assistant without content', { messages: [{ role: 'assistant', content: null, tool_calls: [] }] }, 'assistant\n\n'],
    ['messages not an array', { messages: 'hi' }, undefined],
    ['messages of junk', { messages: [null, 1, 'x', [], { role: 7, content: 8 }] }, undefined],
    ['neither field', { model: 'm' }, undefined],
    ['null body', null, undefined],
    ['array body', [{ prompt: 'x' }], undefined],
    ['string body', 'prompt', undefined],
  ])('%s', (_name, body, expected) => {
    expect(extractPrompt(body)).toBe(expected);
  });

  it('keeps a conversation prefix-stable: each turn starts with the previous turn', () => {
    const history = [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: [{ type: 'text', text: 'Hello.' }] },
      { role: 'user', content: 'Bye' },
    ];
    for (let turn = 1; turn < history.length; turn++) {
      const before = extractPrompt({ messages: history.slice(0, turn) }) as string;
      const after = extractPrompt({ messages: history.slice(0, turn + 1) }) as string;
      expect(after.startsWith(before)).toBe(true);
    }
  });

  it('never throws on hostile shapes', () => {
    let deep: unknown = 'x';
    for (let i = 0; i < 100_000; i++) deep = [deep];
    const throwing = Object.defineProperty({}, 'prompt', {
      get() {
        throw new Error('boom');
      },
    });
    const { proxy, revoke } = Proxy.revocable({}, {});
    revoke();
    const hostile: unknown[] = [
      { prompt: deep },
      { messages: deep },
      { messages: [{ role: 'user', content: deep }] },
      { prompt: new Array(1_000_000).fill(7) },
      { messages: new Array(100_000).fill({ role: 'user', content: [{ text: 1 }] }) },
      JSON.parse('{"__proto__": {"prompt": "p"}, "messages": {"length": 3}}'),
      throwing,
      proxy,
    ];
    for (const body of hostile) expect(() => extractPrompt(body)).not.toThrow();
  });
});
