import type { Endpoint, PickContext, Policy } from '../types';

/** The context of a pick made without the request's own (a retry or a release with none kept). */
export function bareContext(path: string): PickContext {
  return { path, affinityKey: undefined, prompt: undefined };
}

/** The context of every pick by a policy that reads none (`readsContext: false`). */
export const UNREAD_CONTEXT: PickContext = Object.freeze(bareContext('/'));

/**
 * The policy's pick among `candidates`, or `undefined` when it threw or chose an endpoint it
 * was not offered: for picks after the first (retries, queue releases), where the policy's
 * fault has surfaced already and the caller has its own fallback.
 */
export function safePick<E extends Endpoint>(policy: Policy, candidates: readonly E[], context: PickContext): E | undefined {
  try {
    const chosen = policy.pick(candidates, context) as E;
    return candidates.includes(chosen) ? chosen : undefined;
  } catch {
    return undefined;
  }
}
