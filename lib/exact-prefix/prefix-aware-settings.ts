/**
 * The router's `prefixAware` option as settings: the policy's own and the tokenizer's files.
 * Kept apart from the tokenizer's code, so that the public option types never reach the
 * optional packages' types.
 */
import { fail, shown } from '../option-checks';
import { parsePrefixAware, type PrefixAwareConfig } from '../policies/prefix-aware-options';
import type { Policy, PolicyName } from '../types';
import type { TokenizerSource } from './events/source';

/** The router's `prefixAware`, resolved: the policy's settings and the tokenizer's files as given. */
export interface PrefixAwareRouterConfig extends PrefixAwareConfig {
  /** `undefined` when not given; loaded (with the built-in `prefix-aware` policy only) by the router's services. */
  readonly tokenizer: TokenizerSource | undefined;
}

/** The router's `prefixAware` option: checked whatever the policy, the tokenizer's form included. */
export function parseRouterPrefixAware(path: string, value: unknown): PrefixAwareRouterConfig {
  const { tokenizer, ...settings } = parsePrefixAware(path, value);
  return { ...settings, tokenizer: parseTokenizer(`${path}.tokenizer`, tokenizer) };
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
