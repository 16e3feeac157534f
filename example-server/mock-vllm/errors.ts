import { STATUS_CODES } from 'node:http';

/** vLLM's error body (v0.10.1 and later). */
export interface VllmErrorBody {
  error: { message: string; type: string; param: string | null; code: number };
}

/** Builds vLLM's error body; the type is derived from the status, e.g. 400 → `BadRequestError`. */
export function vllmError(status: number, message: string, param: string | null = null): VllmErrorBody {
  return { error: { message, type: errorType(status), param, code: status } };
}

/** `Bad Request` → `BadRequestError`, `Internal Server Error` → `InternalServerError`. */
function errorType(status: number): string {
  const phrase = STATUS_CODES[status];
  if (!phrase) return status >= 500 ? 'InternalServerError' : 'BadRequestError';
  const name = phrase.replace(/[^A-Za-z]/g, '');
  return name.endsWith('Error') ? name : `${name}Error`;
}
