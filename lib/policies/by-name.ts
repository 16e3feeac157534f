import type { Policy, PolicyName } from '../types';
import { leastOutstanding } from './least-outstanding';
import { powerOfTwo } from './power-of-two';
import { prefixAware, type PrefixAwareOptions } from './prefix-aware';
import { random } from './random';
import { roundRobin } from './round-robin';
import { sessionAffinity, type SessionAffinityOptions } from './session-affinity';

/** What a built-in policy may be configured with from the router's options. */
export interface PolicySettings {
  sessionAffinity: Omit<SessionAffinityOptions, 'fallback'>;
  prefixAware: Omit<PrefixAwareOptions, 'fallback'>;
}

/** Every built-in policy name, in the order the docs list them. */
export const POLICY_NAMES: readonly PolicyName[] = [
  'least-outstanding',
  'round-robin',
  'random',
  'power-of-two',
  'session-affinity',
  'prefix-aware',
];

/** Builds a fresh built-in policy: each router gets its own cursors and indexes. */
export function policyByName(name: PolicyName, settings: PolicySettings): Policy {
  switch (name) {
    case 'least-outstanding':
      return leastOutstanding();
    case 'round-robin':
      return roundRobin();
    case 'random':
      return random();
    case 'power-of-two':
      return powerOfTwo();
    case 'session-affinity':
      return sessionAffinity(settings.sessionAffinity);
    case 'prefix-aware':
      return prefixAware(settings.prefixAware);
  }
}
