import { fail, isPolicy, shown } from '../option-checks';
import type { Policy, PolicyName } from '../types';
import { leastOutstanding } from './least-outstanding';
import { powerOfTwo } from './power-of-two';
import { prefixAware } from './prefix-aware';
import type { PrefixAwareConfig } from './prefix-aware-options';
import { random } from './random';
import { roundRobin } from './round-robin';
import { sessionAffinity } from './session-affinity';
import type { SessionAffinityConfig } from './session-affinity-options';

/**
 * What a built-in policy is configured with: the router's `affinity` and `prefixAware`
 * settings, whose other members (where the session key is found, the tokenizer) are not the
 * policy's.
 */
export interface PolicySettings {
  readonly affinity: SessionAffinityConfig & { readonly header?: unknown; readonly bodyField?: unknown };
  readonly prefixAware: PrefixAwareConfig & { readonly tokenizer?: unknown; readonly chatTemplateKwargs?: unknown };
}

/**
 * The built-in policies, one line each, in the order the docs list them: adding one is its file,
 * its name in `PolicyName` (which makes this table incomplete until the line is here) and one
 * line. Each call builds a fresh policy: each router gets its own cursors and indexes.
 */
const BUILT_IN: { readonly [Name in PolicyName]: (settings: PolicySettings) => Policy } = {
  'least-outstanding': () => leastOutstanding(),
  'round-robin': () => roundRobin(),
  random: () => random(),
  'power-of-two': () => powerOfTwo(),
  'session-affinity': ({ affinity: { header: _header, bodyField: _bodyField, ...bounds } }) => sessionAffinity(bounds),
  'prefix-aware': ({ prefixAware: { tokenizer: _tokenizer, chatTemplateKwargs: _kwargs, ...settings } }) => prefixAware(settings),
};

/** Every built-in policy name, in the order the docs list them. */
export const POLICY_NAMES: readonly PolicyName[] = Object.keys(BUILT_IN) as PolicyName[];

const POLICY: PolicyName = 'least-outstanding';

/** The router's `policy` option, checked: a built-in name (the policy is built with the router's services) or a Policy object as it is. */
export function parsePolicy(path: string, value: unknown): PolicyName | Policy {
  if (value === undefined) return POLICY;
  if (typeof value === 'string') {
    if (!POLICY_NAMES.includes(value as PolicyName)) {
      fail(path, `is ${shown(value)}, not a known policy`, `Use one of ${POLICY_NAMES.map((name) => `'${name}'`).join(', ')}, or a Policy object.`);
    }
    return value as PolicyName;
  }
  if (isPolicy(value)) return value;
  return fail(path, `must be a policy name or an object with \`name\` and \`pick(candidates, ctx)\`, got ${shown(value)}`, `Use e.g. \`${path}: '${POLICY}'\`.`);
}

/** The policy a router runs: a fresh built-in one (each router gets its own cursors and indexes), or the user's object. */
export function buildPolicy(policy: PolicyName | Policy, settings: PolicySettings): Policy {
  return typeof policy === 'string' ? policyByName(policy, settings) : policy;
}

/** Builds a fresh built-in policy: each router gets its own cursors and indexes. */
export function policyByName(name: PolicyName, settings: PolicySettings): Policy {
  return BUILT_IN[name](settings);
}
