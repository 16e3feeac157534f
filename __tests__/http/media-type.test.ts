import { describe, expect, it } from '@jest/globals';
import { isEventStreamMediaType, isJsonMediaType } from '../../lib/http/media-type';

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

describe('isEventStreamMediaType', () => {
  it.each([
    [undefined, false],
    ['', false],
    ['text/event-stream', true],
    ['Text/Event-Stream', true],
    ['TEXT/EVENT-STREAM; charset=UTF-8', true],
    [' text/event-stream ;charset=utf-8', true],
    ['text/event-streams', false],
    ['text/plain; note=text/event-stream', false],
    ['application/json', false],
  ])('%p is an event stream: %p', (value, expected) => {
    expect(isEventStreamMediaType(value)).toBe(expected);
  });
});
