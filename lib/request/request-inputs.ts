import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import type { BodyLease } from '../http/body-budget';
import type { EndpointTable } from '../upstreams/endpoints';
import { atHeaderLimit, countHeaderLines, parseBodyRankHint, parseRankHint, type RankHintResult } from './hint';
import { decodeField, fieldToken, isObjectText, scanFields, type JsonField } from '../http/json-fields';
import type { HintConfig } from './hint-options';
import type { AffinityConfig } from '../policies/session-affinity-options';
import type { HintOutcome, Policy } from '../types';
import { extractPrompt } from './prompt';
import { isRecord } from '../guards';
import { MAX_MODEL_NAME, NO_MODEL } from '../upstreams/model-options';

/** A hint that was there: what became of it, its rank when it parsed, and the header or field it came in. */
export type JudgedHint = { outcome: HintOutcome; rank?: number; param: string };
export type HintVerdict = { outcome: 'none' } | JudgedHint;
/**
 * The body's bytes and the members routing reads: either decoded whole (`members`, a small body
 * without a hint field) or found by the scanner (`fields`: spans by name index, decoded alone).
 */
export type BodyView = {
  readonly bytes: Buffer;
  readonly fields: ReadonlyArray<JsonField[] | undefined>;
  readonly members: Readonly<Record<string, unknown>> | undefined;
};

export const NO_HINT: HintVerdict = { outcome: 'none' };
/** What decoding one JSON value may cost, beyond its text: measured 40 bytes (a 16 MiB body of `[],` held 213 MiB), with margin. */
const BYTES_PER_NODE = 48;
/**
 * The most JSON values a scanned prompt is decoded with (`prompt` and `messages` together); past
 * it the request is routed as one without a prompt. Memory alone does not bound the time: a 16 MiB
 * `messages` of empty arrays (5.6 million values) took about 3 s of CPU to decode and collect,
 * within the default budget. 262,144 leaves a prompt of 256 Ki token ids, or a chat far past
 * the 1,024 messages exact routing renders.
 */
const MAX_PROMPT_NODES = 262_144;
/**
 * Bodies up to this size are decoded whole by `JSON.parse`: it runs at about half the scanner's
 * cost per byte, and the scanner's path decodes the prompt's bytes a second time. The tree lives
 * only until the decision, within one turn of the event loop; larger bodies are scanned, so a
 * hostile shape (`[],[],…` parses to 13× its size) never costs many times a large body.
 */
const WHOLE_PARSE_MAX_BYTES = 1024 * 1024;
/** What `JSON.parse` may hold per byte of body while it runs: 13 measured for `[],[],…`, with margin. */
const WHOLE_PARSE_BYTES_PER_BYTE = 16;
const NO_FIELDS: ReadonlyArray<JsonField[] | undefined> = [];
/** The most of a `model` string decoded: longer than any model name even with every character escaped. */
const MAX_MODEL_TOKEN = 6 * MAX_MODEL_NAME + 2;
/** Longest token a valid rank can be written with (10 digits). */
const MAX_RANK_TOKEN = 10;

/** What the request path reads from a request, built once per router. */
export type RequestInputs = ReturnType<typeof createRequestInputs>;

/**
 * What routing reads from a request: its rank hints (judged against the endpoint table), its
 * session key, its prompt. The body members it needs are found in one scan of the raw bytes and
 * decoded alone, within the request's share of the body budget.
 */
export function createRequestInputs(config: { readonly hints: HintConfig; readonly affinity: AffinityConfig }, policy: Pick<Policy, 'usesPrompt' | 'usesAffinityKey'>, table: EndpointTable) {
  const { header: hintHeader, bodyField: hintBodyField } = config.hints;
  const { header: affinityHeader, bodyField: affinityBodyField } = config.affinity;
  const readsAffinityBody = policy.usesAffinityKey === true && affinityBodyField !== undefined;
  // The members routing reads, scanned for once per body; the same name asked twice shares a slot.
  const names: string[] = [];
  const slot = (name: string | undefined) => (name === undefined ? -1 : names.includes(name) ? names.indexOf(name) : names.push(name) - 1);
  const HINT = slot(hintBodyField);
  const AFFINITY = slot(readsAffinityBody ? affinityBodyField : undefined);
  const PROMPT = slot(policy.usesPrompt ? 'prompt' : undefined);
  const MESSAGES = slot(policy.usesPrompt ? 'messages' : undefined);
  // Scanned for whenever a body is: routing by model may begin at run time (discovery, setUpstreams).
  const MODEL = slot('model');
  const encodedNames = names.map((name) => Buffer.from(name));
  /** The hint field as a member's start, `"name":`, for a body without it. */
  const hintMember = hintBodyField === undefined ? undefined : Buffer.from(`${JSON.stringify(hintBodyField)}:`);

  /** Whether routing needs the body. A body hint field is read whoever sent it: an untrusted one is counted and never forwarded. */
  function wantsBody(req: IncomingMessage): boolean {
    return policy.usesPrompt === true || (readsAffinityBody && headerKey(req) === undefined) || hintBodyField !== undefined;
  }

  /** The header hint's verdict, or {@link NO_HINT} when there is none (or none could have been cut off); `headers`: `req.headers`, when the caller has read it already. */
  function headerHint(req: IncomingMessage, trusted: boolean, headers: IncomingHttpHeaders = req.headers): HintVerdict {
    if (headers[hintHeader] === undefined && !(trusted && headersCut(req))) return NO_HINT;
    if (!trusted) return { outcome: 'untrusted', param: hintHeader };
    if (headersCut(req) || countHeaderLines(req.rawHeaders, hintHeader) !== 1) return { outcome: 'malformed', param: hintHeader };
    return judgeRank(parseRankHint(headers[hintHeader]), hintHeader);
  }

  /** The members routing reads, found in a JSON body; a message for the 400 when it is not valid JSON or repeats one. */
  function viewOf(bytes: Buffer, lease: BodyLease | undefined): BodyView | string {
    // A hint field's literal and place are needed as written: only the scanner keeps them.
    if (HINT === -1 && bytes.length <= WHOLE_PARSE_MAX_BYTES) {
      const cost = bytes.length * WHOLE_PARSE_BYTES_PER_BYTE;
      if (lease === undefined || lease.grow(cost)) {
        try {
          return { bytes, fields: NO_FIELDS, members: membersOf(JSON.parse(bytes.toString('utf8'))) };
        } catch {
          return 'Request body is not valid JSON.';
        } finally {
          lease?.shrink(cost);
        }
      }
    }
    const scan = scanFields(bytes, encodedNames);
    if (scan.ok) return { bytes, fields: scan.fields, members: undefined };
    return scan.repeated ? 'Request body repeats a field the router reads.' : 'Request body is not valid JSON.';
  }

  /** The members routing reads from a body a parser already decoded, found in its re-encoding `bytes`. */
  function parsedBodyView(req: IncomingMessage & { body?: unknown }, bytes: Buffer | undefined): BodyView | undefined {
    if (bytes === undefined || typeof req.body !== 'object' || req.body === null || Buffer.isBuffer(req.body)) return undefined;
    // Decoded already: only a hint field, to be rewritten in the bytes forwarded, needs the scan.
    if (HINT === -1) return { bytes, fields: NO_FIELDS, members: membersOf(req.body) };
    const scan = scanFields(bytes, encodedNames);
    return scan.ok ? { bytes, fields: scan.fields, members: undefined } : undefined;
  }

  /**
   * Where the body carries the hint field (`hints.bodyField`), to be rewritten to the rank it is
   * sent to; none yet (`[]`) in a JSON object without it, which gets it, so that an upstream
   * reading the rank from the body (SGLang's native /generate: `GenerateReqInput.routed_dp_rank`)
   * always reads the router's rank there.
   */
  function hintFields(view: BodyView | undefined): JsonField[] | undefined {
    if (HINT === -1 || view === undefined) return undefined;
    return view.fields[HINT] ?? (isObjectText(view.bytes) ? [] : undefined);
  }

  function bodyHint(view: BodyView | undefined, trusted: boolean): HintVerdict {
    const found = HINT === -1 || view === undefined ? undefined : view.fields[HINT];
    if (found === undefined) return NO_HINT;
    if (!trusted) return { outcome: 'untrusted', param: hintBodyField! };
    // Two copies may be read differently by two decoders, as two header lines may.
    if (found.length !== 1 || found[0].end - found[0].start > MAX_RANK_TOKEN) return { outcome: 'malformed', param: hintBodyField! };
    return judgeRank(parseBodyRankHint(fieldToken(view!.bytes, found[0])), hintBodyField!);
  }

  function judgeRank(parsed: RankHintResult, param: string): HintVerdict {
    if (!parsed.ok) return { outcome: 'malformed', param };
    if (!table.isRoutable(parsed.rank)) return { outcome: 'out_of_range', rank: parsed.rank, param };
    if (table.healthyOfRank(parsed.rank).length === 0) return { outcome: 'unavailable', rank: parsed.rank, param };
    return { outcome: 'accepted', rank: parsed.rank, param };
  }

  /** The session key from the affinity header, when it carries one. */
  function headerKey(req: IncomingMessage): string | undefined {
    if (affinityHeader === undefined) return undefined;
    const value = req.headers[affinityHeader];
    if (typeof value === 'string' && value.length > 0) return value;
    if (Array.isArray(value) && value.length > 0) return value[0];
    return undefined;
  }

  /** The session key; one from the body counts against the budget while kept, or is not used. */
  function affinityKey(req: IncomingMessage, body: BodyView | undefined, lease: BodyLease | undefined): string | undefined {
    const fromHeader = headerKey(req);
    if (fromHeader !== undefined) return fromHeader;
    if (body?.members !== undefined) {
      const key = keyOf(body.members[affinityBodyField!]);
      return key !== undefined && lease !== undefined && !lease.grow(2 * key.length) ? undefined : key;
    }
    const found = AFFINITY === -1 || body === undefined ? undefined : body.fields[AFFINITY];
    if (found === undefined) return undefined;
    // Only a string or a number can be a key: anything else is not decoded at all.
    const field = found[found.length - 1];
    const first = body!.bytes[field.start];
    if (first !== 0x22 && first !== 0x2d && (first < 0x30 || first > 0x39)) return undefined;
    if (lease !== undefined && !lease.grow(2 * (field.end - field.start))) return undefined;
    return keyOf(decodeField(body!.bytes, field));
  }

  /**
   * The prompt text from the `prompt` or `messages` member alone. Decoding is bounded by the
   * body budget and by {@link MAX_PROMPT_NODES}: when what it may cost (or the text kept for a
   * retry's pick, until the response ends) does not fit, the request is routed as one without a
   * prompt rather than refused, since
   * its body is already held within the budget. The decoded values are dropped once the text is made.
   */
  function prompt(body: BodyView, lease: BodyLease | undefined): string | undefined {
    if (body.members !== undefined) return kept(extractPrompt(body.members), lease);
    const prompt = body.fields[PROMPT];
    const messages = body.fields[MESSAGES];
    if (prompt === undefined && messages === undefined) return undefined;
    let cost = 0;
    let nodes = 0;
    for (const found of [prompt, messages]) {
      if (found === undefined) continue;
      const field = found[found.length - 1];
      nodes += field.nodes;
      cost += field.nodes * BYTES_PER_NODE + 2 * (field.end - field.start);
    }
    if (nodes > MAX_PROMPT_NODES || (lease !== undefined && !lease.grow(cost))) return undefined;
    let text: string | undefined;
    try {
      const members: Record<string, unknown> = {};
      if (prompt !== undefined) members.prompt = decodeField(body.bytes, prompt[prompt.length - 1]);
      if (messages !== undefined) members.messages = decodeField(body.bytes, messages[messages.length - 1]);
      text = extractPrompt(members);
    } finally {
      lease?.shrink(cost);
    }
    return kept(text, lease);
  }

  /** The prompt text, kept for a retry's pick until the response ends, when the budget holds it. */
  function kept(text: string | undefined, lease: BodyLease | undefined): string | undefined {
    if (text !== undefined && lease !== undefined && !lease.grow(2 * text.length)) return undefined;
    return text;
  }

  /**
   * The body's `model` member: a string, another value (not a string), or {@link NO_MODEL}.
   * A string longer than any model name is cut (it names no model, and is not decoded whole).
   */
  function model(view: BodyView): unknown {
    if (view.members !== undefined) return Object.hasOwn(view.members, 'model') ? view.members.model : NO_MODEL;
    const found = view.fields[MODEL];
    if (found === undefined) return NO_MODEL;
    const field = found[found.length - 1];
    if (view.bytes[field.start] !== 0x22) return null;
    if (field.end - field.start > MAX_MODEL_TOKEN) return fieldToken(view.bytes, { ...field, end: field.start + MAX_MODEL_TOKEN }).slice(1);
    return decodeField(view.bytes, field);
  }

  /** Whether Node may have dropped header lines (`server.maxHeadersCount`): a hint line could be among them. */
  function headersCut(req: IncomingMessage): boolean {
    const server = (req.socket as { server?: { maxHeadersCount?: number | null } } | null)?.server;
    return atHeaderLimit(req.rawHeaders.length / 2, server?.maxHeadersCount);
  }

  return { wantsBody, headerHint, viewOf, parsedBodyView, hintFields, hintMember, bodyHint, affinityKey, prompt, model };
}

/** A decoded body's members: a top-level value that is not an object has none. */
function membersOf(body: unknown): Readonly<Record<string, unknown>> {
  return isRecord(body) ? body : {};
}

/** Only a non-empty string or a number can be a session key. */
function keyOf(value: unknown): string | undefined {
  return (typeof value === 'string' && value.length > 0) || typeof value === 'number' ? String(value) : undefined;
}
