import { integerOption, numberOption, pathOf, policyObjectOption, section, type KeysEnum } from '../option-checks';
import type { Policy } from '../types';
import { leastOutstanding } from './least-outstanding';

/** The settings of the `prefix-aware` policy, for {@link prefixAware} and the router's `prefixAware` option. */
export interface PrefixAwareSettings {
  /**
   * Characters per hashed block. Only whole blocks count, as vLLM caches only full blocks.
   * Default: `64` (about vLLM's 16-token block at ~4 characters per token).
   */
  blockChars?: number;
  /**
   * The memory bound, per endpoint: the index remembers at least the `maxBlocksPerEndpoint`
   * block hashes most recently sent to it and never more than twice that, in fixed tables of
   * `16 × nextPowerOfTwo(maxBlocksPerEndpoint)` bytes: 512 KiB per endpoint for the default
   * (2 M characters, about 500 K tokens of prompt). Match it to the rank's KV cache,
   * `tokens × 4 / blockChars`, so that the index does not forget before the rank does.
   * Default: `32768`.
   */
  maxBlocksPerEndpoint?: number;
  /**
   * The work bound per request: only a prompt's first `maxBlocksPerRequest` blocks are hashed,
   * looked up and recorded; the rest of a longer prompt is routed as if it were not there
   * (its head decides where its cache is anyway). With the index's bounded probing, one
   * request costs at most this many blocks × a fixed number of slot probes, whatever its text.
   * Default: `16384` blocks (1 MiB of prompt at 64 characters, about 256 K tokens: past the
   * 128 K-token context of most served models), or `maxBlocksPerEndpoint` when that is smaller,
   * so that one request cannot flush an endpoint's index.
   */
  maxBlocksPerRequest?: number;
  /**
   * Weight of the content-balance term: an endpoint that received a share `s` of the new
   * blocks recently sent to the candidates (about the last one to two caches' worth) costs
   * `contentBalance × prompt blocks × min(0.5, max(0, s × candidates − 1))` more, so that a
   * prefix held by one endpoint (a shared system prompt) does not draw every new conversation
   * onto it. `0` turns it off. Default: `1`.
   */
  contentBalance?: number;
  /**
   * How far a new prefix (one no endpoint holds) may be placed from the shortest queue, in
   * prompts: it goes to the first endpoint of its rendezvous order (the same in every gateway
   * replica) whose predicted wait is within `placementSlack × its own prefill` of the shortest.
   * `0` places every new prefix on the shortest queue (replicas then disagree); a large value
   * places by the hash alone. Default: `4`.
   */
  placementSlack?: number;
}

/** The router's `prefixAware` option: the policy's settings, and the tokenizer of exact prefix routing. */
export interface PrefixAwareRouterSettings extends PrefixAwareSettings {
  /**
   * The model's tokenizer, for exact prefix routing on upstreams with `kvEvents`: a directory
   * holding `tokenizer.json` and `tokenizer_config.json` (with the chat template the engine
   * uses), or the two files' paths. Loaded at creation, with the `prefix-aware` policy only.
   * Default: none (the approximate index only).
   */
  tokenizer?: string | readonly [string, string];
  /**
   * What the vLLM servers were started with as `--default-chat-template-kwargs` (a JSON object
   * of chat template variables, e.g. `{ enable_thinking: false }`): the tokenizer renders every
   * chat request with them under the request's own `chat_template_kwargs`, as vLLM does. The
   * router cannot ask a server for them; a difference shows as disagreement with its
   * `/tokenize`. Needs `tokenizer`. Default: none.
   */
  chatTemplateKwargs?: Readonly<Record<string, unknown>>;
  /**
   * What a prompt block held in a lower KV-cache tier (vLLM's offloading connector: `CPU`, newer
   * releases also `STORAGE`) is worth against a GPU hit, by medium, on the exact index: loading it
   * back costs less than recomputing it, more than a hit. A medium not named is not scored.
   * Default: `{ GPU: 1, CPU: 0.8 }` (llm-d's; Dynamo uses 0.75 for host memory, 0.25 for disk).
   */
  tierWeights?: Readonly<Record<string, number>>;
}

/** Options of {@link prefixAware}. */
export interface PrefixAwareOptions extends PrefixAwareSettings {
  /** Chooses for requests without a prompt of at least one block. Default: `leastOutstanding()`. */
  fallback?: Policy;
}

/** The settings, resolved. */
export interface PrefixAwareConfig {
  readonly blockChars: number;
  readonly maxBlocksPerEndpoint: number;
  readonly maxBlocksPerRequest: number;
  readonly contentBalance: number;
  readonly placementSlack: number;
}

const BLOCK_CHARS = 64;
const MAX_BLOCKS_PER_ENDPOINT = 32_768;
const MAX_BLOCKS_PER_REQUEST = 16_384;
const CONTENT_BALANCE = 1;
const PLACEMENT_SLACK = 4;
/** 1 MiB of text per block: far past any KV block, and it keeps block arithmetic in integers. */
const MAX_BLOCK_CHARS = 1 << 20;
/** The index's tables are `16 × nextPowerOfTwo(maxBlocksPerEndpoint)` bytes: 256 MiB per endpoint at most. */
const MAX_BLOCKS = 1 << 24;

const SETTINGS_KEYS: KeysEnum<PrefixAwareSettings> = { blockChars: true, maxBlocksPerEndpoint: true, maxBlocksPerRequest: true, contentBalance: true, placementSlack: true };
const POLICY_KEYS: KeysEnum<PrefixAwareOptions> = { ...SETTINGS_KEYS, fallback: true };
const ROUTER_KEYS: KeysEnum<PrefixAwareRouterSettings> = { ...SETTINGS_KEYS, tokenizer: true, chatTemplateKwargs: true, tierWeights: true };

function parseSettings(path: string, settings: Record<string, unknown>): PrefixAwareConfig {
  const maxBlocksPerEndpoint = integerOption(pathOf(path, 'maxBlocksPerEndpoint'), settings.maxBlocksPerEndpoint, MAX_BLOCKS_PER_ENDPOINT, 1, MAX_BLOCKS);
  return {
    blockChars: integerOption(pathOf(path, 'blockChars'), settings.blockChars, BLOCK_CHARS, 1, MAX_BLOCK_CHARS),
    maxBlocksPerEndpoint,
    maxBlocksPerRequest: integerOption(pathOf(path, 'maxBlocksPerRequest'), settings.maxBlocksPerRequest, Math.min(MAX_BLOCKS_PER_REQUEST, maxBlocksPerEndpoint), 1, MAX_BLOCKS),
    contentBalance: numberOption(pathOf(path, 'contentBalance'), settings.contentBalance, CONTENT_BALANCE, 0, 1000),
    placementSlack: numberOption(pathOf(path, 'placementSlack'), settings.placementSlack, PLACEMENT_SLACK, 0, 1e6),
  };
}

/** The router's `prefixAware` option: checked whatever the policy; the tokenizer's options as given (exact routing checks and loads them). */
export function parsePrefixAware(path: string, value: unknown): PrefixAwareConfig & { readonly tokenizer: unknown; readonly chatTemplateKwargs: unknown; readonly tierWeights: unknown } {
  const settings = section(path, value, ROUTER_KEYS);
  return { ...parseSettings(path, settings), tokenizer: settings.tokenizer, chatTemplateKwargs: settings.chatTemplateKwargs, tierWeights: settings.tierWeights };
}

/** {@link prefixAware}'s own options, by the same rules as the router's `prefixAware`. */
export function parsePrefixAwarePolicy(path: string, value: unknown): PrefixAwareConfig & { readonly fallback: Policy } {
  const options = section(path, value, POLICY_KEYS);
  return { ...parseSettings(path, options), fallback: policyObjectOption(pathOf(path, 'fallback'), options.fallback) ?? leastOutstanding() };
}
