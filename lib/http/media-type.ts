/** RFC 9110 token characters, lower-cased: what a subtype is made of. */
const SUBTYPE = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;

/**
 * Whether a `Content-Type` names JSON as vLLM's server (FastAPI) reads it: a missing or empty
 * type is JSON; otherwise the type must be `application/json` or `application/<name>+json`.
 * Type and subtype compare case-insensitively and parameters are ignored (RFC 9110 §8.3.1), so
 * `Application/JSON; charset=utf-8` is JSON and a multipart boundary that spells "json" is not.
 *
 * @example isJsonMediaType('application/vnd.api+json') // true
 * @example isJsonMediaType('multipart/form-data; boundary=json') // false
 */
export function isJsonMediaType(value: string | undefined): boolean {
  if (value === undefined || value === '') return true;
  const essence = mediaTypeEssence(value);
  if (!essence.startsWith('application/')) return false;
  const subtype = essence.slice('application/'.length);
  return (subtype === 'json' || subtype.endsWith('+json')) && SUBTYPE.test(subtype);
}

/**
 * Whether a `Content-Type` is `text/event-stream`, compared as RFC 9110 §8.3.1 says: type and
 * subtype case-insensitively, parameters ignored (`Text/Event-Stream; charset=utf-8` is one).
 */
export function isEventStreamMediaType(value: string | undefined): boolean {
  return value !== undefined && mediaTypeEssence(value) === 'text/event-stream';
}

/** The `type/subtype` of a media type, lower-cased, without parameters or surrounding space. */
function mediaTypeEssence(value: string): string {
  const semicolon = value.indexOf(';');
  return (semicolon === -1 ? value : value.slice(0, semicolon)).trim().toLowerCase();
}
