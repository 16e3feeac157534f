import type { IncomingMessage } from 'node:http';
import type { ExactLookup } from '../policies/exact-pick';
import { evidenceSource } from '../verdicts/source';
import type { PrefixPickContext } from '../policies/prefix-aware';
import type { PickContext } from '../types';
import type { RouteEndpoint } from '../upstreams/endpoints';
import type { BodyView } from './request-inputs';
import type { RouteState } from './route-state';

/** What decoding a whole body for the tokenizer may cost, per body byte: its text twice (UTF-16) and the values, with margin. */
const BODY_DECODE_FACTOR = 4;

/**
 * The pick context with the exact index's view of the candidates, from the whole body (a
 * chat's template fields count), decoded within the body budget and dropped after.
 */
export function exactContext(exact: ExactLookup, context: PickContext, body: BodyView, route: RouteState, candidates: readonly RouteEndpoint[], req: IncomingMessage): PrefixPickContext {
  // Who sent it, for a verdict's evidence: asked only when a receipt or sample is taken.
  const from = () => evidenceSource(req, route.headers, route.ticket?.tenant);
  if (body.members !== undefined) {
    const found = exact.lookupRequest(context.path, body.bytes, candidates, body.members, from);
    return found === undefined ? context : { ...context, exact: found };
  }
  const cost = BODY_DECODE_FACTOR * body.bytes.length;
  const lease = route.lease;
  if (lease !== undefined && !lease.grow(cost)) return context;
  try {
    const found = exact.lookupRequest(context.path, body.bytes, candidates, undefined, from);
    return found === undefined ? context : { ...context, exact: found };
  } finally {
    lease?.shrink(cost);
  }
}
