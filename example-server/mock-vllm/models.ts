/**
 * vLLM's check of a request's `model` (serving_engine.py `_check_model`): absent or null
 * means the served model; any other name than the served one is a 404 `NotFoundError`.
 */
export function unknownModelMessage(served: string, body: unknown): string | undefined {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return undefined;
  const model = (body as Record<string, unknown>).model;
  if (model === undefined || model === null || model === served) return undefined;
  return `The model \`${String(model)}\` does not exist.`;
}
