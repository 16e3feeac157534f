import { booleanOption, fail, integerOption, MAX_TIMER_MS, numberOption, pathOf, toggle, type KeysEnum } from '../option-checks';

/**
 * Route receipts (docs/route-receipts.md): each routed request is checked against what the
 * engine reports afterwards, in its KV events and in the usage of its answer, so that a rank
 * header the server does not honour, or an exact index that no longer matches the engine's
 * cache, shows in metrics and logs, and the router stops relying on it until receipts recover.
 */
export interface ReceiptsOptions {
  /**
   * Judge each exactly routed request by the KV events that follow it: its prompt's new blocks
   * stored by the rank it was sent to (`confirmed`), by another rank (`elsewhere`), by none in
   * `unseenAfterMs` (`unseen`), or nothing new to store (`cached`). Applies where exact routing
   * runs (`kvEvents` on the upstream, `policy: 'prefix-aware'`, `prefixAware.tokenizer`).
   * Default: `true`.
   */
  kvEvents?: boolean;
  /**
   * Compare each prefix-aware prediction of cached prompt tokens with the
   * `usage.prompt_tokens_details.cached_tokens` the engine reports (vLLM with
   * `--enable-prompt-tokens-details`), and the prompt's token count with `usage.prompt_tokens`.
   * Default: `true`.
   */
  usage?: boolean;
  /**
   * Ask a stream sent to an exactly routed upstream, whose usage is to be read (one in
   * `usageEvery`), for its usage (`stream_options: {include_usage: true}`) when the client asked
   * nothing of it and wants one choice, and take that chunk out of the client's stream, which is
   * otherwise the stream the client would have had. Default: `true`.
   */
  askStreamUsage?: boolean;
  /**
   * Read the usage of one answer in this many (every probe's too): usage receipts are a sample,
   * and reading an answer (or taking the usage chunk out of a stream) costs more than the KV
   * receipt every exactly routed request gets (`bench:receipts`: about 40 µs per JSON answer read,
   * 100 µs per stream asked, against 0.6 % of a request for the KV receipts). Default: `16`.
   */
  usageEvery?: number;
  /** How many recent receipts of an upstream each verdict is taken over. Default: `32`. */
  window?: number;
  /** The fewest receipts in the window before a verdict is taken. Default: `10`. */
  minReceipts?: number;
  /**
   * Share of an upstream's recent receipts found `elsewhere` (of those `confirmed` or
   * `elsewhere`) from which its rank header is taken as not honoured: an error is logged and
   * vLLM balances its requests (no rank header) until probes are honoured again. Default: `0.3`.
   */
  elsewhereShare?: number;
  /**
   * Share of an upstream's recent exact predictions that miss (the engine reports more than one
   * block fewer cached tokens than predicted), or of its recent answers that count other prompt
   * tokens than the router's tokenizer, from which its exact index is not trusted: it is routed on
   * the approximate index, with a log line, until probes agree again. Default: `0.5`.
   */
  missShare?: number;
  /** How long a request's new blocks may take to appear in the events before it counts `unseen`. Default: `10_000` ms. */
  unseenAfterMs?: number;
  /** While an upstream is not trusted, every this-many-th request to it is a probe, routed and pinned as before. Default: `10`. */
  probeEvery?: number;
  /** Requests per upstream whose blocks are awaited at once; past it the oldest count `unseen`. Default: `4096`. */
  maxPending?: number;
}

/** `receipts`, resolved. */
export interface ReceiptsConfig {
  readonly kvEvents: boolean;
  readonly usage: boolean;
  readonly askStreamUsage: boolean;
  readonly usageEvery: number;
  readonly window: number;
  readonly minReceipts: number;
  readonly elsewhereShare: number;
  readonly missShare: number;
  readonly unseenAfterMs: number;
  readonly probeEvery: number;
  readonly maxPending: number;
}

const KEYS: KeysEnum<ReceiptsOptions> = {
  kvEvents: true,
  usage: true,
  askStreamUsage: true,
  usageEvery: true,
  window: true,
  minReceipts: true,
  elsewhereShare: true,
  missShare: true,
  unseenAfterMs: true,
  probeEvery: true,
  maxPending: true,
};

const WINDOW = 32;
const MIN_RECEIPTS = 10;
/** The most receipts a window keeps: verdicts are about the recent past. */
const MAX_WINDOW = 1024;

/** `receipts`: on by default; `false` turns every part off (`undefined`). */
export function parseReceipts(path: string, value: unknown): ReceiptsConfig | undefined {
  const receipts = toggle(path, value, KEYS, true);
  if (receipts === undefined) return undefined;
  const window = integerOption(pathOf(path, 'window'), receipts.window, WINDOW, 1, MAX_WINDOW);
  const minReceipts = integerOption(pathOf(path, 'minReceipts'), receipts.minReceipts, Math.min(MIN_RECEIPTS, window), 1, MAX_WINDOW);
  if (minReceipts > window) {
    fail(pathOf(path, 'minReceipts'), `must not exceed \`${pathOf(path, 'window')}\` (${window}), got ${minReceipts}`, `Use e.g. \`minReceipts: ${Math.min(MIN_RECEIPTS, window)}\`, or a larger \`window\`.`);
  }
  const config: ReceiptsConfig = {
    kvEvents: booleanOption(pathOf(path, 'kvEvents'), receipts.kvEvents, true),
    usage: booleanOption(pathOf(path, 'usage'), receipts.usage, true),
    askStreamUsage: booleanOption(pathOf(path, 'askStreamUsage'), receipts.askStreamUsage, true),
    usageEvery: integerOption(pathOf(path, 'usageEvery'), receipts.usageEvery, 16, 1, 1_000_000),
    window,
    minReceipts,
    // Above 0 and below 1: at 0 every upstream would trip at once, at 1 none ever could.
    elsewhereShare: numberOption(pathOf(path, 'elsewhereShare'), receipts.elsewhereShare, 0.3, 0.01, 0.99),
    missShare: numberOption(pathOf(path, 'missShare'), receipts.missShare, 0.5, 0.01, 0.99),
    unseenAfterMs: integerOption(pathOf(path, 'unseenAfterMs'), receipts.unseenAfterMs, 10_000, 1, MAX_TIMER_MS),
    probeEvery: integerOption(pathOf(path, 'probeEvery'), receipts.probeEvery, 10, 1, 1_000_000),
    maxPending: integerOption(pathOf(path, 'maxPending'), receipts.maxPending, 4096, 1, 1_048_576),
  };
  return config;
}
