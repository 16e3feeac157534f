/** Whether `value` is an object that is not an array: a JSON object, an options section. */
export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
