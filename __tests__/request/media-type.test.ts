import { describe, expect, it } from '@jest/globals';
import { isJsonMediaType } from '../../lib/request/media-type';

describe('isJsonMediaType', () => {
  it.each([
    [undefined, true],
    ['', true],
    ['application/json', true],
    ['Application/JSON', true],
    ['APPLICATION/JSON; charset=UTF-8', true],
    ['application/json ; charset=utf-8', true],
    ['application/vnd.api+json', true],
    ['application/merge-patch+JSON', true],
    ['multipart/form-data; boundary=----json', false],
    ['multipart/form-data; boundary=application/json', false],
    ['text/plain; note=json', false],
    ['text/json', false],
    ['application/jsonl', false],
    ['application/json-seq', false],
    ['application/x-ndjson', false],
    ['application/octet-stream', false],
    ['application/+json x', false],
    ['json', false],
  ])('%p is JSON as vLLM reads it: %p', (value, expected) => {
    expect(isJsonMediaType(value)).toBe(expected);
  });
});
