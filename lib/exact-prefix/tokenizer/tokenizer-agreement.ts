/**
 * Verifies the router's tokenizer against the upstream's: for a sample of requests, the same
 * prompt goes to vLLM's `POST /tokenize` and the returned ids are compared with the router's.
 * A different tokenizer file, chat template or vLLM default would otherwise route every
 * request on keys that never match the engine's blocks, silently.
 *
 * Sampling is bounded three ways, so it never loads the upstream or delays routing: a share of
 * requests (the first one always), a least interval between checks, and one check in flight.
 * The check runs after the routing decision, on its own socket, with a timeout; its failures
 * (upstream down, an error answer, a timeout) are not counted either way.
 */
import { smallRequest, SmallHttpError } from '../../http/small-http';
import { isRefused } from './refusals';
import { laxBool, requestTemplateKwargs } from './template-arguments';
import type { PromptKind } from './tokenizer-options';
import { unmodelled } from '../../verdicts/modelled';

/** Options of {@link TokenizerAgreement}. */
export interface TokenizerAgreementOptions {
  /** The upstream's base URL, e.g. `http://10.0.0.5:8000`. */
  url: string;
  /** The `model` sent when the request names none. Default: none sent (vLLM then uses its served model). */
  model?: string;
  /** Share of offered requests checked, after the first. Default 0.01. */
  sampleRate?: number;
  /** Least time between two checks, in ms. Default 1000. */
  minIntervalMs?: number;
  /** A check not answered in full within this long is dropped, in ms (a deadline, not an idle timeout). Default 5000. */
  timeoutMs?: number;
  /** Told each compared sample's outcome. */
  onResult?: (result: AgreementResult) => void;
  /** Told when a check could not be made (uncounted). */
  onError?: (reason: string) => void;
  /** The random source for sampling; default `Math.random`. */
  random?: () => number;
  /** The clock for `minIntervalMs`; default `Date.now`. */
  now?: () => number;
}

/** One compared sample. */
export interface AgreementResult {
  agreed: boolean;
  /** Who sent the request sampled (lib/verdicts/source.ts), when known. */
  source?: string;
  /** Agreed samples over compared samples so far. */
  ratio: number;
  compared: number;
  /** On disagreement: the first differing position and both lengths, for the warning. */
  difference?: { at: number; routerCount: number; upstreamCount: number };
}

const MAX_RESPONSE_BYTES = 64 * 1024 * 1024;

/** The agreement sampler of one upstream. */
export class TokenizerAgreement {
  private readonly target: URL;
  private readonly options: TokenizerAgreementOptions;
  private readonly sampleRate: number;
  private readonly minIntervalMs: number;
  private readonly timeoutMs: number;
  private readonly random: () => number;
  private readonly now: () => number;
  private lastCheck = -Infinity;
  private inFlight = 0;
  private offered = 0;
  private closed = false;
  private agreedCount = 0;
  private comparedCount = 0;

  constructor(options: TokenizerAgreementOptions) {
    this.options = options;
    this.target = new URL('tokenize', options.url.endsWith('/') ? options.url : `${options.url}/`);
    this.sampleRate = options.sampleRate ?? 0.01;
    this.minIntervalMs = options.minIntervalMs ?? 1000;
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.random = options.random ?? Math.random;
    this.now = options.now ?? Date.now;
  }

  /** Agreed over compared samples, or undefined before the first comparison. */
  get ratio(): number | undefined {
    return this.comparedCount === 0 ? undefined : this.agreedCount / this.comparedCount;
  }

  get compared(): number {
    return this.comparedCount;
  }

  /** False once any sample disagreed. */
  get agreeing(): boolean {
    return this.agreedCount === this.comparedCount;
  }

  /**
   * Offers one routed request (its parsed body and the router's tokens for its first prompt);
   * checks it if the sample picks it. Returns at once; never throws.
   */
  offer(kind: PromptKind, body: Record<string, unknown>, tokens: readonly number[], from?: () => string): void {
    if (unmodelled(kind, body, true) !== undefined) return;
    const first = this.offered++ === 0;
    if (this.closed || this.inFlight > 0 || this.now() - this.lastCheck < this.minIntervalMs) return;
    if (!first && !(this.random() < this.sampleRate)) return;
    void this.check(kind, body, tokens, from?.());
  }

  /** Checks one request now, unsampled (`source`: who sent it); resolves to its result, or undefined when no check could be made. */
  check(kind: PromptKind, body: Record<string, unknown>, tokens: readonly number[], source?: string): Promise<AgreementResult | undefined> {
    const payload = tokenizeBody(kind, body, this.options.model);
    if (payload === undefined) return Promise.resolve(undefined);
    this.lastCheck = this.now();
    this.inFlight++;
    // The slot is free before the listener hears of the result.
    return this.post(payload).then(
      (upstream) => {
        this.inFlight--;
        return this.compare(tokens, upstream, source);
      },
      (error: Error) => {
        this.inFlight--;
        this.options.onError?.(error.message);
        return undefined;
      },
    );
  }

  /**
   * The router's own probe: whether `/tokenize` gives `tokens` for a request the router built
   * itself (its fixed samples); `undefined` when it could not be asked. Not a sample: not
   * counted in the ratio, not told to `onResult`.
   */
  async confirm(kind: PromptKind, body: Record<string, unknown>, tokens: readonly number[]): Promise<boolean | undefined> {
    const payload = tokenizeBody(kind, body, this.options.model);
    if (payload === undefined || this.closed) return undefined;
    try {
      const upstream = await this.post(payload);
      return upstream.length === tokens.length && upstream.every((id, at) => id === tokens[at]);
    } catch {
      return undefined;
    }
  }

  /** Stops sampling. */
  close(): void {
    this.closed = true;
  }

  private compare(tokens: readonly number[], upstream: number[], source: string | undefined): AgreementResult {
    let at = 0;
    while (at < tokens.length && at < upstream.length && tokens[at] === upstream[at]) at++;
    const agreed = at === tokens.length && at === upstream.length;
    this.comparedCount++;
    if (agreed) this.agreedCount++;
    const result: AgreementResult = { agreed, ratio: this.agreedCount / this.comparedCount, compared: this.comparedCount };
    if (source !== undefined) result.source = source;
    if (!agreed) result.difference = { at, routerCount: tokens.length, upstreamCount: upstream.length };
    this.options.onResult?.(result);
    return result;
  }

  private async post(payload: string): Promise<number[]> {
    try {
      const answer = await smallRequest(this.target, { method: 'POST', headers: { 'content-type': 'application/json' }, body: payload, deadlineMs: this.timeoutMs, maxBytes: MAX_RESPONSE_BYTES });
      return tokensOf(answer.body);
    } catch (error) {
      throw error instanceof SmallHttpError ? new Error(reasonOf(error, this.timeoutMs)) : error;
    }
  }
}

/** The reason `onError` is told, in the sampler's own words. */
function reasonOf(error: SmallHttpError, timeoutMs: number): string {
  switch (error.failure) {
    case 'status':
      return `/tokenize answered HTTP ${error.status}`;
    case 'timeout':
      return `/tokenize timed out after ${timeoutMs} ms`;
    case 'too-large':
      return '/tokenize answer too large';
    case 'cut-short':
      return '/tokenize answer cut short';
    default:
      return error.message;
  }
}

/**
 * vLLM's `/tokenize` body for the same prompt: the fields that change its tokens, nothing else;
 * undefined for a request the router does not model exactly (lib/verdicts/modelled.ts: the one
 * predicate every check that can change routing for everyone shares, e.g.
 * `truncate_prompt_tokens`, which `/tokenize` has no field for, or `tool_choice: "none"` with
 * tools, which a server with `--exclude-tools-when-tool-choice-none` renders without them and
 * its `/tokenize` with them), which is then never counted either way.
 *
 * `/tokenize` has no `documents` or `reasoning_effort` field (serve/tokenize/protocol.py) but
 * merges `chat_template_kwargs` as chat does: they go there, with the `enable_thinking` the
 * chat request's `reasoning_effort` implies (template-arguments.ts).
 */
function tokenizeBody(kind: PromptKind, body: Record<string, unknown>, model: string | undefined): string | undefined {
  const out: Record<string, unknown> = {};
  const named = typeof body.model === 'string' ? body.model : model;
  if (named !== undefined) out.model = named;
  if (unmodelled(kind, body, true) !== undefined) return undefined;
  if (kind === 'chat') {
    for (const key of CHAT_FIELDS) if (body[key] !== undefined) out[key] = body[key];
    if (out.messages === undefined) return undefined;
    const kwargs = requestTemplateKwargs(body, laxBool(body.add_generation_prompt, true) === true, laxBool(body.continue_final_message, false) === true);
    if (isRefused(kwargs)) return undefined;
    out.chat_template_kwargs = kwargs;
  } else {
    const prompt = Array.isArray(body.prompt) ? body.prompt[0] : body.prompt;
    // A token-array prompt is used as it is: nothing to verify.
    if (typeof prompt !== 'string') return undefined;
    out.prompt = prompt;
  }
  return JSON.stringify(out);
}

const CHAT_FIELDS = ['messages', 'add_generation_prompt', 'continue_final_message', 'tools'];

function tokensOf(answer: Buffer): number[] {
  let body: unknown;
  try {
    body = JSON.parse(answer.toString('utf8'));
  } catch {
    throw new Error('/tokenize answered invalid JSON');
  }
  const tokens = (body as { tokens?: unknown } | null)?.tokens;
  if (!Array.isArray(tokens) || !tokens.every((id) => Number.isSafeInteger(id))) throw new Error('/tokenize answer has no token list');
  return tokens as number[];
}
