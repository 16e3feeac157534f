/**
 * vLLM's check of a request's `model` (serving_engine.py `_check_model`): absent or null
 * means the served model; the served name or a LoRA adapter's (`--lora-modules`) is known; any
 * other name is a 404 `NotFoundError`.
 */
export function unknownModelMessage(served: string, body: unknown, adapters: readonly string[] = []): string | undefined {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return undefined;
  const model = (body as Record<string, unknown>).model;
  if (model === undefined || model === null || model === served || (typeof model === 'string' && adapters.includes(model))) return undefined;
  return `The model \`${String(model)}\` does not exist.`;
}

/**
 * The LoRA adapter a request names: vLLM looks `model` up among its adapters first
 * (engine/serving.py `_maybe_get_adapters`); ids count from 1 in `--lora-modules` order.
 */
export function adapterOf(body: unknown, adapters: readonly string[]): { name: string; id: number } | undefined {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return undefined;
  const model = (body as Record<string, unknown>).model;
  const at = typeof model === 'string' ? adapters.indexOf(model) : -1;
  return at < 0 ? undefined : { name: adapters[at], id: at + 1 };
}
