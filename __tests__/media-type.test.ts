import { describe, expect, it } from '@jest/globals';
import { isJsonMediaType } from '../lib/media-type';

describe('isJsonMediaType', () => {
  it.each([
    [undefined],
    [''],
    ['application/json'],
    ['Application/JSON'],
    ['APPLICATION/JSON; charset=UTF-8'],
    ['application/json ; charset=utf-8'],
    ['application/vnd.api+json'],
    ['application/merge-patch+JSON'],
  ])('reads %p as JSON, as vLLM does', (value) => {
    expect(isJsonMediaType(value)).toBe(true);
  });

  it.each([
    ['multipart/form-data; boundary=----json'],
    ['multipart/form-data; boundary=application/json'],
    ['text/plain; note=json'],
    ['text/json'],
    ['application/jsonl'],
    ['application/json-seq'],
    ['application/x-ndjson'],
    ['application/octet-stream'],
    ['application/+json x'],
    ['json'],
  ])('does not read %p as JSON', (value) => {
    expect(isJsonMediaType(value)).toBe(false);
  });
});
