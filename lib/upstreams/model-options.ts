import { fail, shown } from '../option-checks';

/** Longest model name accepted, configured or learned: Hugging Face ids and adapter names are far shorter. */
export const MAX_MODEL_NAME = 256;

/** A body without a `model` member (as opposed to one whose `model` is not a string). */
export const NO_MODEL: unique symbol = Symbol('no model');

/** Whether `value` can be a model name: 1 to {@link MAX_MODEL_NAME} characters, no control characters. */
export function isModelName(value: unknown): value is string {
  // eslint-disable-next-line no-control-regex
  return typeof value === 'string' && value.length > 0 && value.length <= MAX_MODEL_NAME && !/[\x00-\x1f\x7f]/.test(value);
}

/** `upstreams[i].models`: the served model names; `undefined` when not given (it serves every model). Throws {@link OptionError}. */
export function parseModels(path: string, value: unknown): readonly string[] | undefined {
  if (value === undefined) return undefined;
  const fix = `Use e.g. \`${path}: ['meta-llama/Llama-3.1-8B-Instruct']\` (vLLM's --served-model-name, and any --lora-modules names), or leave it out to serve every model.`;
  if (!Array.isArray(value) || value.length === 0) fail(path, `must be a non-empty array of model names, got ${shown(value)}`, fix);
  const names = new Set<string>();
  for (const name of value) {
    if (!isModelName(name)) fail(path, `holds ${shown(name)}, which is not a model name of 1 to ${MAX_MODEL_NAME} characters`, fix);
    if (names.has(name)) fail(path, `lists '${name}' twice`, 'List each model once.');
    names.add(name);
  }
  return [...names];
}
