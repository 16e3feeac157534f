/**
 * The bodies of a disaggregated request's two legs, made from the client's raw JSON bytes:
 * members are removed and added in place, never by re-encoding the document, so the decode leg
 * gets the client's bytes as they came except for `kv_transfer_params` (vLLM's Rust front end
 * refuses a repeated member, so a member is replaced, never appended twice).
 */
import { decodeField, isObjectText, scanFields, type FieldScan, type JsonField } from '../http/json-fields';

const SPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);
const encode = (name: string) => Buffer.from(name);

const KV_TRANSFER_PARAMS = 'kv_transfer_params';
const PREFILL_NAMES = [KV_TRANSFER_PARAMS, 'stream', 'stream_options', 'max_tokens', 'max_completion_tokens', 'min_tokens'].map(encode);
/** Positions in {@link PREFILL_NAMES}. */
const KV = 0;
const MAX_COMPLETION = 4;
const MIN_TOKENS = 5;
const DECODE_NAMES = [encode(KV_TRANSFER_PARAMS)];
const ANSWER_NAMES = [encode(KV_TRANSFER_PARAMS)];

/** NIXL's prefill request: compute the prompt's KV cache, keep its blocks for a remote decode. */
export const NIXL_PREFILL_PARAMS =
  '{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}';

/** Mooncake's prefill request: the same, sending the blocks to whoever names `transferId`. */
export function mooncakePrefillParams(transferId: string): string {
  return `{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":${JSON.stringify(transferId)}}`;
}

/**
 * Mooncake's decode request: receive the blocks of `transferId` from the prefill rank's engine.
 * The engine is named by its id alone: vLLM 52a31cc's connector reads `remote_engine_id`,
 * `remote_bootstrap_addr` and `transfer_id` (mooncake_connector.py:323-334 and 605-608), never a
 * rank, and its own proxy sends these five members only
 * (examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py:299-305).
 */
export function mooncakeDecodeParams(transferId: string, bootstrapAddr: string, engineId: string): string {
  return (
    `{"do_remote_decode":false,"do_remote_prefill":true,"remote_bootstrap_addr":${JSON.stringify(bootstrapAddr)},` +
    `"remote_engine_id":${JSON.stringify(engineId)},"transfer_id":${JSON.stringify(transferId)}}`
  );
}

/** A hint field to carry into the prefill body with that leg's own rank (`hints.bodyField`). */
export interface RankField {
  readonly name: Buffer;
  /** The JSON text of its value: the prefill rank's header value, or `null`. */
  readonly value: string;
}

/**
 * The prefill leg's body: the client's, with `kv_transfer_params` set to `params`, `stream:
 * false`, no `stream_options`, `max_tokens: 1` (and `max_completion_tokens: 1` when given),
 * `min_tokens` at most 1, and the hint field (when one is given) carrying the prefill rank.
 * `undefined` when the body is not one JSON object (the caller answers 400).
 */
export function prefillBody(bytes: Buffer, params: string, rankField?: RankField, scan: FieldScan = scanLegs(bytes, rankField)): Buffer | undefined {
  const names = rankField === undefined ? PREFILL_NAMES : [...PREFILL_NAMES, rankField.name];
  if (!scan.ok || !isObjectText(bytes)) return undefined;
  const { fields } = scan;
  const added = [`"${KV_TRANSFER_PARAMS}":${params}`, '"stream":false', '"max_tokens":1'];
  if (fields[MAX_COMPLETION] !== undefined) added.push('"max_completion_tokens":1');
  const drop: JsonField[] = [];
  for (let at = 0; at < names.length; at++) {
    const found = fields[at];
    if (found === undefined) continue;
    if (at === MIN_TOKENS) {
      // vLLM refuses min_tokens above max_tokens: at most 1 (vllm-project/router clamps it too).
      const value = decodeField(bytes, found[found.length - 1]);
      if (typeof value !== 'number' || value <= 1) continue;
      added.push('"min_tokens":1');
    }
    drop.push(...found);
  }
  if (rankField !== undefined && fields[names.length - 1] !== undefined) added.push(`${JSON.stringify(rankField.name.toString())}:${rankField.value}`);
  return rewrite(bytes, drop, added);
}

/** The one scan of a client body both legs' bodies are made from (the members the prefill body rewrites, `kv_transfer_params` first). */
export function scanLegs(bytes: Buffer, rankField?: RankField): FieldScan {
  return scanFields(bytes, rankField === undefined ? PREFILL_NAMES : [...PREFILL_NAMES, rankField.name]);
}

/**
 * The decode leg's body: the client's bytes with its own `kv_transfer_params` (if any: a client
 * must never point an engine at a transfer of its choosing) replaced by `params`, the prefill
 * answer's object verbatim, or left out when there is none. `undefined` when the body is not
 * one JSON object.
 */
export function decodeBody(bytes: Buffer, params: string | undefined, scan: FieldScan = scanFields(bytes, DECODE_NAMES)): Buffer | undefined {
  if (!scan.ok || !isObjectText(bytes)) return undefined;
  // The first name of both scans is `kv_transfer_params`.
  const found = scan.fields[KV];
  if (found === undefined && params === undefined) return bytes;
  return rewrite(bytes, found ?? [], params === undefined ? [] : [`"${KV_TRANSFER_PARAMS}":${params}`]);
}

/**
 * The top-level `kv_transfer_params` object of a prefill answer, as the bytes it was written
 * with; `undefined` when the answer is not JSON, or carries none (absent, `null`, `{}`, not an
 * object): the prefill did not keep its blocks for a remote decode.
 */
export function transferParamsOf(answer: Buffer): string | undefined {
  const scan = scanFields(answer, ANSWER_NAMES);
  if (!scan.ok || !isObjectText(answer)) return undefined;
  const found = scan.fields[0];
  if (found === undefined) return undefined;
  const field = found[found.length - 1];
  const text = answer.toString('utf8', field.start, field.end);
  if (text[0] !== '{' || /^\{\s*\}$/.test(text)) return undefined;
  return text;
}

/**
 * `bytes` (a valid JSON object) without the members `drop` and with the member texts `added`
 * after the rest. Each dropped member goes with the comma before it, the first member with
 * none; a comma left leading the rest is removed.
 */
function rewrite(bytes: Buffer, drop: readonly JsonField[], added: readonly string[]): Buffer {
  let open = 0;
  while (bytes[open] !== 0x7b) open++;
  let close = bytes.length - 1;
  while (bytes[close] !== 0x7d) close--;
  const spans = drop
    .map((field) => {
      let start = field.keyStart;
      let before = start - 1;
      while (SPACE.has(bytes[before])) before--;
      if (bytes[before] === 0x2c) start = before;
      return [start, field.end] as const;
    })
    .sort((a, b) => a[0] - b[0]);
  const kept: Buffer[] = [];
  let from = open + 1;
  for (const [start, end] of spans) {
    if (start > from) kept.push(bytes.subarray(from, start));
    from = Math.max(from, end);
  }
  kept.push(bytes.subarray(from, close));
  let rest = Buffer.concat(kept);
  let lead = 0;
  while (SPACE.has(rest[lead])) lead++;
  if (rest[lead] === 0x2c) rest = rest.subarray(lead + 1);
  const blank = rest.every((byte) => SPACE.has(byte));
  const tail = added.join(',');
  return Buffer.concat([Buffer.from('{'), blank ? Buffer.alloc(0) : rest, Buffer.from(blank || tail === '' ? tail : `,${tail}`), Buffer.from('}')]);
}
