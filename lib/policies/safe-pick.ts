import type { Endpoint, PickContext } from '../types';
import type { PickResult, RoutePolicy } from './route-policy';

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
export function safePick<E extends Endpoint>(policy: RoutePolicy, candidates: readonly E[], context: PickContext): E | undefined {
  return safeResult(policy, candidates, context)?.endpoint;
}

/** {@link safePick}'s result: what the pick found, valid until the policy's next pick. */
export function safeResult<E extends Endpoint>(policy: RoutePolicy, candidates: readonly E[], context: PickContext): PickResult<E> | undefined {
  try {
    const found = policy.pick(candidates, context);
    return candidates.includes(found.endpoint) ? found : undefined;
  } catch {
    return undefined;
  }
}
