/**
 * The options of exact prefix routing: `upstreams[].kvEvents` and `prefixAware.tokenizer`,
 * validated once at creation. The public option types reach this module: it must not import
 * the tokenizer, whose declarations name the optional packages' types (load-tokenizer.ts does).
 */
import { fail, isPlainObject, section, shown, type KeysEnum } from '../option-checks';
import { parsePrefixAware, type PrefixAwareConfig } from '../policies/prefix-aware-options';
import type { Policy, PolicyName } from '../types';
import { resolveKvEndpoints } from './events/endpoints';
import type { KvEventsOptions, TokenizerSource } from './events/source';

export type { KvEventsOptions, TokenizerSource } from './events/source';

const KV_EVENTS_KEYS: KeysEnum<KvEventsOptions> = { endpoint: true, replayEndpoint: true, topic: true };
const TOPIC = '';

/** `upstreams[i].kvEvents`, checked against the ranks it serves; `undefined` when not given. */
export function parseKvEvents(path: string, value: unknown, ranks: readonly number[]): KvEventsOptions | undefined {
  if (value === undefined) return undefined;
  const options = section(path, value, KV_EVENTS_KEYS);
  const replayEndpoint = options.replayEndpoint === undefined ? undefined : endpointOption(`${path}.replayEndpoint`, options.replayEndpoint, ranks);
  const topic = options.topic ?? TOPIC;
  if (typeof topic !== 'string') fail(`${path}.topic`, `must be a string, got ${shown(options.topic)}`, "Use vLLM's `topic`, or leave it out for ''.");
  if (options.endpoint === undefined) fail(`${path}.endpoint`, 'is required', "Give rank 0's publisher, e.g. `endpoint: 'tcp://10.0.0.5:5557'`.");
  const endpoint = endpointOption(`${path}.endpoint`, options.endpoint, ranks);
  return { endpoint, ...(replayEndpoint !== undefined && { replayEndpoint }), topic };
}

function endpointOption(path: string, value: unknown, ranks: readonly number[]): string | readonly string[] {
  if (typeof value !== 'string' && !(Array.isArray(value) && value.every((one) => typeof one === 'string'))) {
    fail(path, `must be a ZeroMQ endpoint or an array of them, got ${shown(value)}`, "Use e.g. `'tcp://10.0.0.5:5557'`.");
  }
  try {
    resolveKvEndpoints(value as string | string[], ranks, path);
  } catch (error) {
    // resolveKvEndpoints names the path and the fix; only the form of the message changes.
    const message = (error as Error).message;
    const problem = message.startsWith(path) ? message.slice(path.length).replace(/^:? /, '') : message;
    fail(path, problem.replace(/\.$/, ''), "vLLM's `--kv-events-config` binds `tcp://*:PORT`; connect to its host.");
  }
  return Array.isArray(value) ? [...value] : (value as string);
}

/** The router's `prefixAware`, resolved: the policy's settings and the tokenizer's files as given. */
export interface PrefixAwareRouterConfig extends PrefixAwareConfig {
  /** `undefined` when not given; loaded (with the built-in `prefix-aware` policy only) by the router's services. */
  readonly tokenizer: TokenizerSource | undefined;
  /** The servers' `--default-chat-template-kwargs`, as the tokenizer renders chat with them; `{}` when not given. */
  readonly chatTemplateKwargs: Readonly<Record<string, unknown>>;
  /** By medium, upper-cased; `GPU` is 1. */
  readonly tierWeights: Readonly<Record<string, number>>;
}

/** The router's `prefixAware` option: checked whatever the policy, the tokenizer's form included. */
export function parseRouterPrefixAware(path: string, value: unknown): PrefixAwareRouterConfig {
  const { tokenizer, chatTemplateKwargs, tierWeights, ...settings } = parsePrefixAware(path, value);
  const files = parseTokenizer(`${path}.tokenizer`, tokenizer);
  return { ...settings, tokenizer: files, chatTemplateKwargs: parseChatTemplateKwargs(`${path}.chatTemplateKwargs`, chatTemplateKwargs, files), tierWeights: parseTierWeights(`${path}.tierWeights`, tierWeights) };
}

/** llm-d's weights: a block in host memory is worth 0.8 of a GPU hit. */
const TIER_WEIGHTS: Readonly<Record<string, number>> = Object.freeze({ GPU: 1, CPU: 0.8 });

/** `prefixAware.tierWeights`: the defaults with the given media (upper-cased, as vLLM names them) over them. */
export function parseTierWeights(path: string, value: unknown): Readonly<Record<string, number>> {
  if (value === undefined) return TIER_WEIGHTS;
  if (!isPlainObject(value)) fail(path, `must be an object of weights by medium, got ${shown(value)}`, 'Use e.g. `tierWeights: { GPU: 1, CPU: 0.8 }`.');
  const weights: Record<string, number> = { ...TIER_WEIGHTS };
  for (const [medium, weight] of Object.entries(value)) {
    if (!/^[A-Za-z][A-Za-z0-9_]{0,31}$/.test(medium)) fail(`${path}.${medium}`, 'is not a medium name', "Name vLLM's media, e.g. `CPU` or `STORAGE`.");
    if (typeof weight !== 'number' || !(weight >= 0 && weight <= 1)) fail(`${path}.${medium}`, `must be a number from 0 to 1, got ${shown(weight)}`, 'Use e.g. `CPU: 0.8`: a GPU hit is 1, a recompute 0.');
    if (medium.toUpperCase() === 'GPU' && weight !== 1) fail(`${path}.${medium}`, `must be 1, got ${shown(weight)}`, 'A GPU hit is the unit the other tiers are weighed against: leave `GPU` out or set it to 1.');
    weights[medium.toUpperCase()] = weight;
  }
  return Object.freeze(weights);
}

/**
 * Keys of `--default-chat-template-kwargs` that are not template variables: vLLM hands them to
 * its own calls (vllm/renderers/hf.py `safe_apply_chat_template`; transformers'
 * `apply_chat_template`), with effects the router does not reproduce.
 */
const NOT_VARIABLES: Readonly<Record<string, string>> = {
  messages: 'vLLM passes the conversation as `messages` itself (rendering then fails)',
  conversation: 'it is apply_chat_template\'s conversation (rendering then fails)',
  chat_template: 'vLLM would render with it instead of the model\'s template, which the router does not follow',
  tokenize: 'vLLM would tokenize inside apply_chat_template and skip `add_special_tokens`, which the router does not follow',
};

/** `prefixAware.chatTemplateKwargs`: a JSON object, as vLLM's `--default-chat-template-kwargs` takes; `{}` when not given. */
export function parseChatTemplateKwargs(path: string, value: unknown, tokenizer: TokenizerSource | undefined): Readonly<Record<string, unknown>> {
  if (value === undefined) return Object.freeze({});
  const example = 'e.g. `chatTemplateKwargs: { enable_thinking: false }` for `--default-chat-template-kwargs \'{"enable_thinking": false}\'`';
  if (!isPlainObject(value)) fail(path, `must be an object of chat template variables, got ${shown(value)}`, `Give what the vLLM servers were started with as \`--default-chat-template-kwargs\`, ${example}.`);
  if (tokenizer === undefined) fail(path, 'is set but `prefixAware.tokenizer` is not: only the tokenizer renders chat templates', "Set `prefixAware.tokenizer` to the model's files too, or remove it.");
  for (const [key, why] of Object.entries(NOT_VARIABLES)) {
    if (Object.hasOwn(value, key)) fail(`${path}.${key}`, `is not a template variable: ${why}`, `Remove it; a server started with it renders chat requests another way than the router can.`);
  }
  for (const [key, one] of Object.entries(value)) {
    if (!isJson(one)) fail(`${path}.${key}`, `must be JSON (what vLLM's flag takes), got ${shown(one)}`, `Use strings, numbers, booleans, null, arrays and objects, ${example}.`);
  }
  // A copy of the user's object, so that changing it later changes nothing here.
  return Object.freeze(JSON.parse(JSON.stringify(value)) as Record<string, unknown>);
}

function isJson(value: unknown, depth = 0): boolean {
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return true;
  if (typeof value === 'number') return Number.isFinite(value);
  if (depth > 32) return false;
  if (Array.isArray(value)) return value.every((one) => isJson(one, depth + 1));
  return isPlainObject(value) && Object.getPrototypeOf(value) === Object.prototype && Object.values(value).every((one) => isJson(one, depth + 1));
}

/**
 * The tokenizer exact prefix routing loads for a pool picked by `policy`: only the built-in
 * `'prefix-aware'`, named as a string, routes on KV events; `undefined` for any other.
 */
export function exactTokenizer(policy: PolicyName | Policy, prefixAware: PrefixAwareRouterConfig): TokenizerSource | undefined {
  return policy === 'prefix-aware' ? prefixAware.tokenizer : undefined;
}

/** `prefixAware.tokenizer`'s form, checked whatever the policy; `undefined` when not given. */
export function parseTokenizer(path: string, value: unknown): TokenizerSource | undefined {
  if (value === undefined) return undefined;
  const files = typeof value === 'string' || (Array.isArray(value) && value.length === 2 && value.every((one) => typeof one === 'string'));
  if (!files) {
    fail(path, `must be a path or two paths, got ${shown(value)}`, "Use the model's directory holding tokenizer.json and tokenizer_config.json, e.g. `tokenizer: '/models/llama-3.1-8b'`.");
  }
  return typeof value === 'string' ? value : [value[0], value[1]];
}

/**
 * `kvEvents` on an upstream needs the tokenizer that turns prompts into the engines' blocks: with
 * `policy: 'prefix-aware'` and no `prefixAware.tokenizer` it would be ignored without a word
 * (no subscription, approximate routing), so that is an {@link OptionError}, at creation and in
 * `setUpstreams()`.
 */
export function requireTokenizerForKvEvents(upstreams: readonly { readonly kvEvents?: unknown }[], prefixAware: boolean, tokenizer: TokenizerSource | undefined): void {
  if (!prefixAware || tokenizer !== undefined) return;
  const index = upstreams.findIndex((upstream) => upstream.kvEvents !== undefined);
  if (index < 0) return;
  fail(
    'prefixAware.tokenizer',
    `is not set, so \`upstreams[${index}].kvEvents\` would be ignored and prefix-aware would route on the approximate index`,
    "Set it to the model's tokenizer files (the directory with tokenizer.json and tokenizer_config.json the engine serves), e.g. `prefixAware: { tokenizer: '/models/llama-3.1-8b' }`, or remove `kvEvents`.",
  );
}

/**
 * The notice for `kvEvents` that no exact routing reads (another policy than the built-in
 * `'prefix-aware'`, named as a string); `undefined` when there is none.
 */
export function unusedKvEventsNotice(upstreams: readonly { readonly kvEvents?: unknown }[], exactRouting: boolean, policy: string): string | undefined {
  if (exactRouting) return undefined;
  const index = upstreams.findIndex((upstream) => upstream.kvEvents !== undefined);
  if (index < 0) return undefined;
  return `express-dp-router: \`upstreams[${index}].kvEvents\` is ignored: only \`policy: 'prefix-aware'\` (by name) with \`prefixAware.tokenizer\` routes on KV events, and this router's policy is '${policy}'. Set those, or remove \`kvEvents\`.`;
}
