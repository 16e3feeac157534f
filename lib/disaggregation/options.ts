import { fail, integerOption, oneOf, section, shown, type KeysEnum } from '../option-checks';
import { parsePolicy } from '../policies/by-name';
import type { Policy, PolicyName } from '../types';
import type { UpstreamConfig } from '../upstreams/upstream-options';

/** How the KV cache moves from the prefill rank to the decode rank (vLLM's `kv_connector`). */
export type Connector = 'nixl' | 'mooncake';

/** The header a trusted caller names the prefill rank with (the rank header names the decode rank). */
export const PREFILL_HINT_HEADER = 'x-data-parallel-prefill-rank';
/** What a request gets when its prefill leg fails. */
export type PrefillFailureMode = 'decode-only' | 'fail';

/** Prefill/decode disaggregation (docs/disaggregation.md). */
export interface DisaggregationOptions {
  /**
   * The KV connector the vLLM servers run: `'nixl'` (NixlConnector: the prefill answer's
   * `kv_transfer_params` go to the decode leg, which pulls the blocks) or `'mooncake'`
   * (MooncakeConnector: both legs at once, sharing a `transfer_id`, the decode leg naming the
   * prefill rank's engine from its bootstrap server). Default: `'nixl'`.
   */
  connector?: Connector;
  /** The policy that picks the prefill rank (`policy` picks the decode rank). Default: `'prefix-aware'`. */
  prefillPolicy?: PolicyName | Policy;
  /**
   * When the prefill leg fails (refused, reset, 5xx, timed out, or answered without
   * `kv_transfer_params`): `'decode-only'` sends the original request to the decode rank, which
   * prefills it itself; `'fail'` answers 502 (504 for a timeout). Default: `'decode-only'`.
   */
  onPrefillFailure?: PrefillFailureMode;
  /**
   * NIXL: how long a prefill server keeps a request's KV blocks for the decode leg to start
   * reading them, in ms: the servers' `kv_connector_extra_config.kv_lease_duration` (vLLM
   * 52a31cc: 30 s; the decode engine renews the lease once the request reaches it). The decode
   * leg's connects are cut to fit the lease left, and it is not retried past it.
   * Default: `30_000`.
   */
  kvLeaseMs?: number;
}

/** `disaggregation`, resolved. */
export interface DisaggregationConfig {
  readonly connector: Connector;
  /** A built-in policy's name or the user's Policy: built with the router's services. */
  readonly prefillPolicy: PolicyName | Policy;
  readonly onPrefillFailure: PrefillFailureMode;
  readonly kvLeaseMs: number;
}

const CONNECTORS: readonly Connector[] = ['nixl', 'mooncake'];
const FAILURE_MODES: readonly PrefillFailureMode[] = ['decode-only', 'fail'];
const PREFILL_POLICY: PolicyName = 'prefix-aware';
const ON_PREFILL_FAILURE: PrefillFailureMode = 'decode-only';
/** vLLM 52a31cc's `kv_lease_duration` default (nixl/scheduler.py:70-73), in ms. */
const KV_LEASE_MS = 30_000;
const KEYS: KeysEnum<DisaggregationOptions> = { connector: true, prefillPolicy: true, onPrefillFailure: true, kvLeaseMs: true };

/**
 * `disaggregation` and the upstreams' roles, checked together: a role or a bootstrap port
 * without `disaggregation`, or a pool left empty, is an {@link OptionError}.
 */
export function parseDisaggregation(path: string, value: unknown, upstreams: readonly UpstreamConfig[]): DisaggregationConfig | undefined {
  if (value === undefined || value === false) {
    upstreams.forEach((upstream, index) => {
      if (upstream.role !== 'both') {
        fail(`upstreams[${index}].role`, `is '${upstream.role}', but \`${path}\` is not set`, `Add \`${path}: { connector: 'nixl' }\` to split prefill and decode, or leave \`role\` out.`);
      }
    });
    checkBootstrapPorts(upstreams, undefined);
    return undefined;
  }
  const options = section(path, value, KEYS);
  const connector = oneOf(`${path}.connector`, options.connector, CONNECTORS, 'nixl');
  checkPools(path, upstreams);
  checkBootstrapPorts(upstreams, connector);
  return {
    connector,
    prefillPolicy: parsePolicy(`${path}.prefillPolicy`, options.prefillPolicy ?? PREFILL_POLICY),
    onPrefillFailure: oneOf(`${path}.onPrefillFailure`, options.onPrefillFailure, FAILURE_MODES, ON_PREFILL_FAILURE),
    kvLeaseMs: integerOption(`${path}.kvLeaseMs`, options.kvLeaseMs, KV_LEASE_MS, 1, 2 ** 31 - 1),
  };
}

/** Checks an upstream list (creation and `setUpstreams()`) against `disaggregation`: both pools have a member. */
export function checkPools(path: string, upstreams: readonly UpstreamConfig[]): void {
  if (!upstreams.some((upstream) => upstream.role !== 'decode')) {
    fail(path, 'leaves the prefill leg without an upstream', "Give at least one upstream `role: 'prefill'` (or `'both'`).");
  }
  if (!upstreams.some((upstream) => upstream.role !== 'prefill')) {
    fail(path, 'leaves the decode leg without an upstream', "Give at least one upstream `role: 'decode'` (or `'both'`).");
  }
}


function checkBootstrapPorts(upstreams: readonly UpstreamConfig[], connector: Connector | undefined): void {
  upstreams.forEach((upstream, index) => {
    if (upstream.bootstrapPort === undefined) return;
    const path = `upstreams[${index}].bootstrapPort`;
    if (connector !== 'mooncake') {
      fail(path, `is ${shown(upstream.bootstrapPort)}, but only the Mooncake connector has a bootstrap server`, "Set `disaggregation.connector: 'mooncake'`, or leave `bootstrapPort` out.");
    }
    if (upstream.role === 'decode') {
      fail(path, 'is set on a decode upstream', 'Only prefill servers run the bootstrap server: give it to the upstreams with `role: \'prefill\'`.');
    }
  });
}
