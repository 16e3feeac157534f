/**
 * Reading `usage` from an answer without parsing the answer: vLLM puts it last, in a JSON
 * answer (`ChatCompletionResponse.usage`, followed only by small members) and in a stream's
 * final usage chunk (`stream_options.include_usage`), so the tail of the bytes holds it.
 *
 * `prompt_tokens_details.cached_tokens` is there only when the server runs with
 * `--enable-prompt-tokens-details`. vLLM 52a31cc (vllm/entrypoints/openai/engine/protocol.py:101-109,
 * chat_completion/serving.py 945-956 and 1384-1387, completion/serving.py 446-449 and 584-590)
 * sets it only when some prompt tokens were cached too, leaving the member out otherwise (it is
 * `None`, and the stream's usage chunk is dumped with `exclude_none`); newer vLLM (upstream main of
 * 2026-08-19: chat_completion/serving.py:87-105, completion/serving.py:453-456 and 604-611) sets it
 * whenever the count is known, `{"cached_tokens":0}` when nothing was (the count starts at 0,
 * v1/engine/output_processor.py:176). A `0` is read as a report of 0; an absent member alone
 * cannot tell "nothing cached" (52a31cc) from "not reported": receipts learn per upstream whether
 * it reports them (book.ts).
 */

/** What an answer's usage says, as far as receipts read it. */
export interface ReportedUsage {
  readonly promptTokens: number;
  /** `prompt_tokens_details.cached_tokens`; `undefined` when the answer carries none. */
  readonly cachedTokens: number | undefined;
}

const USAGE = /"usage"\s*:\s*\{/g;
/** The most of a usage object read: vLLM's is under 150 bytes. */
const MAX_USAGE_CHARS = 2048;

/** The last `usage` object in `text` (an answer's tail, or one stream event); `undefined` when there is none that parses. */
export function lastUsage(text: string): ReportedUsage | undefined {
  let start = -1;
  USAGE.lastIndex = 0;
  for (let match = USAGE.exec(text); match !== null; match = USAGE.exec(text)) start = match.index + match[0].length - 1;
  if (start === -1) return undefined;
  const end = objectEnd(text, start);
  if (end === -1) return undefined;
  let usage: unknown;
  try {
    usage = JSON.parse(text.slice(start, end));
  } catch {
    return undefined;
  }
  const { prompt_tokens: promptTokens, prompt_tokens_details: details } = usage as Record<string, unknown>;
  if (!isCount(promptTokens)) return undefined;
  const cached = typeof details === 'object' && details !== null ? (details as Record<string, unknown>).cached_tokens : undefined;
  return { promptTokens, cachedTokens: isCount(cached) ? cached : undefined };
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

/** Where the JSON object opening at `start` ends (past its `}`), within {@link MAX_USAGE_CHARS}; −1 when it does not. */
function objectEnd(text: string, start: number): number {
  let depth = 0;
  let quoted = false;
  const limit = Math.min(text.length, start + MAX_USAGE_CHARS);
  for (let at = start; at < limit; at++) {
    const char = text.charCodeAt(at);
    if (quoted) {
      if (char === 0x5c) at++;
      else if (char === 0x22) quoted = false;
    } else if (char === 0x22) quoted = true;
    else if (char === 0x7b) depth++;
    else if (char === 0x7d && --depth === 0) return at + 1;
  }
  return -1;
}

/**
 * The last bytes of an answer as it flows: references to its last chunks, at least
 * {@link TAIL_BYTES} of them once there are that many, never a copy until the answer ends.
 */
export class AnswerTail {
  private chunks: Buffer[] = [];
  /** The first chunk still kept (dropped ones are cut off in batches, not shifted one by one). */
  private first = 0;
  private bytes = 0;

  add(chunk: Buffer): void {
    const { chunks } = this;
    chunks.push(chunk);
    this.bytes += chunk.length;
    while (chunks.length - this.first > 1 && this.bytes - chunks[this.first].length >= TAIL_BYTES) this.bytes -= chunks[this.first++].length;
    if (this.first >= 64) {
      this.chunks = chunks.slice(this.first);
      this.first = 0;
    }
  }

  /** The tail, as text (latin1: only ASCII matters, and no byte is lost to decoding). */
  text(): string {
    const kept = this.chunks.length - this.first;
    if (kept === 0) return '';
    const whole = kept === 1 ? this.chunks[this.first] : Buffer.concat(this.chunks.slice(this.first));
    return whole.subarray(Math.max(0, whole.length - TAIL_BYTES)).toString('latin1');
  }
}

/** Bytes of an answer's end kept: a stream's usage chunk and `[DONE]`, a JSON answer's last members. */
export const TAIL_BYTES = 8192;
