import type { GatewayErrorType } from '../errors';
import type { JudgedHint } from './request-inputs';

/** The answer to a trusted hint judged invalid under `onInvalid: 'reject'`. */
export interface HintRejectionAnswer {
  readonly status: 400 | 503;
  readonly type: Extract<GatewayErrorType, 'BadRequestError' | 'ServiceUnavailableError'>;
  readonly message: string;
  /** The header or body field that carried it. */
  readonly param: string;
}

/**
 * What a rejected hint gets, worded for the ranks it names (`'data-parallel'` for whole requests
 * and decode legs, `'prefill'` for the prefill leg's own hint); `routable` lists the ranks there are.
 */
export function hintRejection(verdict: JudgedHint, what: 'data-parallel' | 'prefill', routable: string): HintRejectionAnswer {
  const param = verdict.param;
  if (verdict.outcome === 'malformed') {
    return { status: 400, type: 'BadRequestError', message: `${param} must be a single non-negative decimal rank without sign, spaces or leading zeros.`, param };
  }
  if (verdict.outcome === 'out_of_range') {
    return { status: 400, type: 'BadRequestError', message: `${param} ${verdict.rank} is not a routable ${what} rank (routable: ${routable}).`, param };
  }
  const named = what === 'prefill' ? 'Prefill' : 'Data-parallel';
  return { status: 503, type: 'ServiceUnavailableError', message: `${named} rank ${verdict.rank} has no healthy endpoint.`, param };
}
