import type { ServerResponse } from 'node:http';
import { markError } from './observe/tracing';

/** The error types the gateway answers with, named as vLLM and OpenAI name them. */
export type GatewayErrorType =
  | 'BadRequestError'
  | 'RateLimitError'
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
