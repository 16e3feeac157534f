/**
 * Asking a stream for its usage: vLLM sends a stream's usage (and with it
 * `prompt_tokens_details.cached_tokens`) only in a final chunk that `stream_options:
 * {include_usage: true}` asks for (vllm/entrypoints/utils.py:281-293, `should_include_usage`,
 * at 52a31cc). The router asks only where the client asked nothing about it (no
 * `stream_options` at all), so that nothing the client chose changes; usage-strip.ts takes the
 * chunk out of the client's stream.
 */

const ASK = Buffer.from('"stream_options":{"include_usage":true},');

/**
 * Whether a body's decoded members are a stream the router may ask for its usage: one that asked
 * nothing about it, with a single choice (no `n`, and one completions prompt), so that the only
 * event held back while the usage chunk is awaited is the one ending that choice (usage-strip.ts).
 */
export function mayAskUsage(members: Readonly<Record<string, unknown>>): boolean {
  if (members.stream !== true || members.stream_options !== undefined || (members.n !== undefined && members.n !== 1)) return false;
  const { prompt } = members;
  return prompt === undefined || typeof prompt === 'string' || (Array.isArray(prompt) && typeof prompt[0] === 'number');
}

/**
 * `body` (a JSON object with at least a `stream` member, so never empty) with the request for
 * usage as its first member; `undefined` when it does not begin with `{`.
 */
export function askingUsage(body: Buffer): Buffer | undefined {
  let at = 0;
  while (at < body.length && (body[at] === 0x20 || body[at] === 0x09 || body[at] === 0x0a || body[at] === 0x0d)) at++;
  if (body[at] !== 0x7b) return undefined;
  return Buffer.concat([body.subarray(0, at + 1), ASK, body.subarray(at + 1)]);
}
