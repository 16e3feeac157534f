import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { decodeField, fieldToken, MAX_OCCURRENCES, replaceValues, scanFields } from '../../lib/http/json-fields';

const KEYS = ['a', 'prompt', '\\', 'é', 'routed_dp_rank'];
const NAMES = KEYS.map((key) => Buffer.from(key));

/** Whether `JSON.parse` accepts the text, and its value. */
function parsed(text: string): { ok: boolean; value?: unknown } {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch {
    return { ok: false };
  }
}

describe('scanFields', () => {
  it('accepts exactly what JSON.parse accepts, and finds the members JSON.parse would keep', () => {
    const texts = fc.oneof(
      fc.json(),
      fc.string(),
      fc.json().map((text) => text.slice(0, -1)),
      fc.json().map((text) => text.replace(',', ',,')),
      fc.json().map((text) => ` \n${text}\t`),
      fc.dictionary(fc.constantFrom(...KEYS, 'other'), fc.jsonValue()).map((value) => JSON.stringify(value, null, 1)),
    );
    fc.assert(
      fc.property(texts, (text) => {
        const expected = parsed(text);
        const bytes = Buffer.from(text);
        const scan = scanFields(bytes, NAMES);
        expect(scan.ok).toBe(expected.ok);
        const value = expected.value;
        if (!scan.ok || typeof value !== 'object' || value === null || Array.isArray(value)) return;
        KEYS.forEach((key, index) => {
          const found = scan.fields[index];
          expect(found !== undefined).toBe(Object.hasOwn(value, key));
          if (found) expect(decodeField(bytes, found[found.length - 1])).toEqual((value as Record<string, unknown>)[key]);
        });
      }),
      { numRuns: 5000 },
    );
  });

  it.each([['\uFEFF{}'], ['{"a":1}x'], ['[1,]'], ['{"a":01}'], ['"\u0001"'], ['{"a":"\\x"}'], ['-'], ['1.'], ['tru'], ['']])('rejects %j', (text) => {
    expect(scanFields(Buffer.from(text), NAMES).ok).toBe(false);
  });

  it('reads escaped keys as their decoded name, keeps every copy in order and the raw token', () => {
    const bytes = Buffer.from('{"routed\\u005fdp_rank": 2.0 ,"x":[{"routed_dp_rank":7}],"routed_dp_rank":-0}');
    const scan = scanFields(bytes, NAMES);
    expect(scan.ok).toBe(true);
    const found = scan.ok ? scan.fields[4]! : [];
    expect(found.map((field) => fieldToken(bytes, field))).toEqual(['2.0', '-0']);
  });

  it('does not go deep into recursion on deep nesting', () => {
    const depth = 1_000_000;
    expect(scanFields(Buffer.from(`${'['.repeat(depth)}${']'.repeat(depth)}`), NAMES).ok).toBe(true);
  });

  it(`fails a body that repeats a routing member more than ${MAX_OCCURRENCES} times`, () => {
    const members = (count: number) => `{${Array.from({ length: count }, () => '"prompt":1').join(',')}}`;
    expect(scanFields(Buffer.from(members(MAX_OCCURRENCES)), NAMES).ok).toBe(true);
    expect(scanFields(Buffer.from(members(MAX_OCCURRENCES + 1)), NAMES)).toEqual({ ok: false, repeated: true });
  });

  it('counts the values inside a member, what decoding it would build', () => {
    const bytes = Buffer.from('{"prompt":[[],[1,"x"],{}],"a":1}');
    const scan = scanFields(bytes, NAMES);
    expect(scan.ok && scan.fields[1]![0].nodes).toBe(6);
  });
});

describe('replaceValues', () => {
  it('replaces each value and moves the spans, so a second replacement lands right', () => {
    const bytes = Buffer.from('{"routed_dp_rank":99,"p":"é","routed_dp_rank":"x"}');
    const scan = scanFields(bytes, NAMES);
    const fields = scan.ok ? scan.fields[4]! : [];
    const once = replaceValues(bytes, fields, '2');
    expect(once.toString()).toBe('{"routed_dp_rank":2,"p":"é","routed_dp_rank":2}');
    const twice = replaceValues(once, fields, 'null');
    expect(twice.toString()).toBe('{"routed_dp_rank":null,"p":"é","routed_dp_rank":null}');
    expect(bytes.toString()).toBe('{"routed_dp_rank":99,"p":"é","routed_dp_rank":"x"}');
  });
});
