import { describe, expect, it } from '@jest/globals';
import { Template } from '@huggingface/jinja';
import { MOCK_TOKENIZER_DIR } from '../../../example-server/mock-vllm/tokenize';
import { pythonStrip } from '../../../lib/exact-prefix/tokenizer/python-strip';
import { PromptTokenizer, readTokenizerFiles } from '../../../lib/exact-prefix/tokenizer/tokenizer';

const files = readTokenizerFiles(MOCK_TOKENIZER_DIR);
/** The fixture's tokenizer with `template` as its chat template. */
const withTemplate = (template: string) => new PromptTokenizer({ ...files, config: { ...files.config, chat_template: template } });
const render = (template: string, content: string) =>
  withTemplate(template).renderChat({ messages: [{ role: 'user', content }], add_generation_prompt: false });

// Expected values as Python 3 computes them: str.strip() strips the characters for which
// str.isspace() is true (U+0009–U+000D, U+001C–U+001F, U+0020, U+0085, U+00A0, U+1680,
// U+2000–U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), and neither U+FEFF nor U+200B.
const STRIP: Array<[string, string, string, string, string]> = [
  // [what, content, .strip(), .lstrip(), .rstrip()]
  ['information separators U+001C–U+001F', '\x1c\x1dA\x1e\x1f', 'A', 'A\x1e\x1f', '\x1c\x1dA'],
  ['next line U+0085', '\x85A\x85', 'A', 'A\x85', '\x85A'],
  ['a byte-order mark U+FEFF, kept', '\ufeffA\ufeff', '\ufeffA\ufeff', '\ufeffA\ufeff', '\ufeffA\ufeff'],
  ['a zero-width space U+200B, kept', '\u200bA\u200b', '\u200bA\u200b', '\u200bA\u200b', '\u200bA\u200b'],
  ['ASCII whitespace', ' \t\n\x0b\x0c\rA\r\n ', 'A', 'A\r\n ', ' \t\n\x0b\x0c\rA'],
  ['Unicode spaces and separators', '\u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000A\u3000\u2029', 'A', 'A\u3000\u2029', '\u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000A'],
  ['a mark inside the stripped space', '\x1d \ufeff A \ufeff \x1e', '\ufeff A \ufeff', '\ufeff A \ufeff \x1e', '\x1d \ufeff A \ufeff'],
  ['only separators', '\x1c\x1d\x1e\x1f\x85', '', '', ''],
  ['astral characters at the edges', '\u{1F600} A \u{1F600}', '\u{1F600} A \u{1F600}', '\u{1F600} A \u{1F600}', '\u{1F600} A \u{1F600}'],
  ['nothing to strip', 'A B', 'A B', 'A B', 'A B'],
];

describe('pythonStrip', () => {
  it.each(STRIP)('%s', (_what, content, strip, lstrip, rstrip) => {
    expect(pythonStrip(content)).toBe(strip);
    expect(pythonStrip(content, 'start')).toBe(lstrip);
    expect(pythonStrip(content, 'end')).toBe(rstrip);
  });

  it.each([
    ['xyAyx', 'xy', 'A'],
    ['\u{1F600}A\u{1F600}', '\u{1F600}', 'A'],
    ['\x85A\x85', 'A', '\x85A\x85'],
  ])('strips the characters given: %j.strip(%j) is %j', (content, chars, expected) => {
    expect(pythonStrip(content, 'both', chars)).toBe(expected);
  });
});

describe('chat templates strip as jinja2 does', () => {
  it.each(STRIP)('%s', (_what, content, strip, lstrip, rstrip) => {
    expect(render("[{{ messages[0]['content'] | trim }}]", content)).toBe(`[${strip}]`);
    expect(render("[{{ messages[0]['content'].strip() }}]", content)).toBe(`[${strip}]`);
    expect(render("[{{ messages[0]['content'].lstrip() }}]", content)).toBe(`[${lstrip}]`);
    expect(render("[{{ messages[0]['content'].rstrip() }}]", content)).toBe(`[${rstrip}]`);
  });

  it('strips the characters a template names, and leaves other filters and methods alone', () => {
    expect(render("[{{ messages[0]['content'].strip('xy') }}]", 'xyAyx')).toBe('[A]');
    expect(render("[{{ messages[0]['content'].lstrip('x') }}|{{ messages[0]['content'].rstrip('x') }}]", 'xAx')).toBe('[Ax|xA]');
    expect(render("[{{ messages[0]['content'] | upper }}|{{ messages[0]['content'].split(',') | length }}]", 'a,b')).toBe('[A,B|2]');
    expect(render("[{{ (messages[0]['content'] ~ ' ') | trim | length }}]", '\x85')).toBe('[0]');
  });

  // transformers' continue_final_message strips the final message with Python's str.strip() to
  // find it in the rendered prompt, keeps its trailing space only when the template kept the
  // whole message as given, and cuts there.
  it.each([
    ['a separator-edged message the template keeps', '\x1cpartial\x1c', '<q><\x1cpartial'],
    ['trailing next-line kept', 'partial\x85', '<q><partial\x85'],
    ['a byte-order mark, which is no space', 'partial\ufeff', '<q><partial\ufeff'],
    ['leading space, cut at the stripped end', ' partial ', '<q>< partial'],
  ])('continues a final message with %s', (_what, content, expected) => {
    const tokenizer = withTemplate("{% for m in messages %}<{{ m['content'] }}>{% endfor %}");
    const messages = [{ role: 'user', content: 'q' }, { role: 'assistant', content }];
    expect(tokenizer.renderChat({ messages, add_generation_prompt: false, continue_final_message: true })).toBe(expected);
  });

  it('leaves other users of @huggingface/jinja with the package as it is', () => {
    render("[{{ messages[0]['content'] | trim }}]", '\x85A\x85');
    expect(new Template("[{{ x | trim }}|{{ x.strip() }}]").render({ x: '\ufeffA\ufeff' })).toBe('[A|A]');
  });
});
