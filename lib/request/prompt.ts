import { isRecord } from '../guards';
/**
 * Prompt text for prefix-aware routing, taken from an OpenAI-style body that the router
 * has already parsed.
 *
 * The text only has to be stable and prefix-preserving, not identical to what the model
 * sees: a conversation's next turn must produce a text that starts with the previous
 * turn's text, so that its cached blocks match. Hence the per-message layout
 * `role + "\n" + content + "\n"`, with content parts (`{ type: 'text', text }`) joined by
 * `"\n"`, so `content: "hi"` and `content: [{ type: 'text', text: 'hi' }]` read the same.
 * Non-text parts (images, audio) and non-string fields are skipped.
 *
 * `prompt` of /v1/completions: a string as is; an array of strings (a batch) joined by
 * `"\n"`; token ids (`number[]`, or `number[][]` for a batch) as `"<id>,"` per id, which
 * keeps a prefix of ids a prefix of the text.
 */

/** Returns the prompt text of a completions or chat completions body, or `undefined`. Never throws. */
export function extractPrompt(body: unknown): string | undefined {
  try {
    if (!isRecord(body)) return undefined;
    const { prompt, messages } = body;
    if (prompt !== undefined) return promptText(prompt);
    if (messages !== undefined) return messagesText(messages);
  } catch {
    // Only hostile objects (throwing getters, revoked proxies) or a text past V8's string
    // length limit get here; a JSON.parse result cannot throw.
  }
  return undefined;
}

function promptText(prompt: unknown): string | undefined {
  if (typeof prompt === 'string') return prompt;
  if (!Array.isArray(prompt) || prompt.length === 0) return undefined;
  const parts: string[] = [];
  for (const item of prompt) {
    if (typeof item === 'string') parts.push(item);
    else if (typeof item === 'number') parts.push(tokenIdText(item));
    else if (Array.isArray(item)) parts.push(tokenIdsText(item));
  }
  if (parts.length === 0) return undefined;
  // Token ids concatenate (one sequence); strings and id batches are separate prompts.
  const joiner = typeof prompt[0] === 'number' ? '' : '\n';
  const text = parts.join(joiner);
  return text.length > 0 ? text : undefined;
}

function tokenIdsText(ids: readonly unknown[]): string {
  let text = '';
  for (const id of ids) if (typeof id === 'number') text += tokenIdText(id);
  return text;
}

function tokenIdText(id: number): string {
  return `${id},`;
}

function messagesText(messages: unknown): string | undefined {
  if (!Array.isArray(messages)) return undefined;
  const parts: string[] = [];
  for (const message of messages) {
    if (!isRecord(message)) continue;
    const role = typeof message.role === 'string' ? message.role : '';
    const content = contentText(message.content);
    if (content === undefined && role === '') continue;
    parts.push(role, '\n', content ?? '', '\n');
  }
  const text = parts.join('');
  return text.length > 0 ? text : undefined;
}

function contentText(content: unknown): string | undefined {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return undefined;
  const texts: string[] = [];
  for (const part of content) {
    if (isRecord(part) && typeof part.text === 'string') texts.push(part.text);
  }
  return texts.length > 0 ? texts.join('\n') : undefined;
}
