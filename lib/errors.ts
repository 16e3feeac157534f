import type { ServerResponse } from 'node:http';
import { markError } from './observe/tracing';

/**
 * The stable codes of the errors the package throws or passes to `next(error)`, for matching
 * on `error.code` rather than on message text (express-rate-limit's `ERR_ERL_…`).
 */
export const ERROR_CODES = {
  /** A wrong option of `dpRouter()`, `dpRank()` or a policy factory: {@link OptionError}. */
  option: 'ERR_DPR_OPTION',
  /** A custom policy threw, or returned an endpoint that was not among the candidates: {@link PolicyError}. */
  policy: 'ERR_DPR_POLICY',
} as const;

/** One of {@link ERROR_CODES}. */
export type ErrorCode = (typeof ERROR_CODES)[keyof typeof ERROR_CODES];

/**
 * A wrong option of `dpRouter()`, `dpRank()` or a policy factory. A `TypeError`, so that
 * `instanceof TypeError` holds; the message reads
 * ``express-dp-router: `<path>` <problem>. <fix>``; `code` is `'ERR_DPR_OPTION'`.
 */
export class OptionError extends TypeError {
  /** Always `'ERR_DPR_OPTION'`. */
  readonly code = ERROR_CODES.option;
  /** Where the option sits, e.g. `'upstreams[1].dataParallelSize'` or `'sessionAffinity.loadFactor'`. */
  readonly path: string;
  /** What to change, e.g. ``Use e.g. `retries.attempts: 2`.``. */
  readonly fix: string;

  constructor(path: string, problem: string, fix: string) {
    super(`express-dp-router: \`${path}\` ${problem}. ${fix}`);
    this.name = 'OptionError';
    this.path = path;
    this.fix = fix;
  }
}

/**
 * A policy broke its contract on a request (a custom `pick` returned an endpoint that was not a
 * candidate): passed to `next(error)`, as a fault of the code, not of the client. `code` is
 * `'ERR_DPR_POLICY'`.
 */
export class PolicyError extends TypeError {
  /** Always `'ERR_DPR_POLICY'`. */
  readonly code = ERROR_CODES.policy;
  /** The policy's `name`. */
  readonly policy: string;

  constructor(policy: string, problem: string) {
    super(`express-dp-router: policy '${policy}' ${problem}.`);
    this.name = 'PolicyError';
    this.policy = policy;
  }
}

/** The error types the gateway answers with, named as vLLM and OpenAI name them. */
export type GatewayErrorType =
  | 'BadRequestError'
  | 'RequestTimeoutError'
  | 'RequestEntityTooLargeError'
  | 'BadGatewayError'
  | 'NotImplementedError'
  | 'ServiceUnavailableError'
  | 'GatewayTimeoutError';

/** vLLM's error body (v0.10.1 and later), so OpenAI clients surface the message as they would vLLM's own. */
export function errorBody(status: number, type: GatewayErrorType, message: string, param: string | null = null): string {
  return JSON.stringify({ error: { message, type, param, code: status } });
}

/**
 * Answers with a vLLM-shaped error unless an answer has already begun; mid-response the only
 * honest signal left is to cut the connection, so a client cannot mistake a truncated body
 * for a complete one.
 */
export function sendError(
  res: ServerResponse,
  status: number,
  type: GatewayErrorType,
  message: string,
  param: string | null = null,
): void {
  markError(res, status, message);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (res.destroyed) return;
  const body = errorBody(status, type, message, param);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}
