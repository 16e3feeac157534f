/**
 * The model's tokenizer files (and what tokenizer.ts reads from them: added tokens, the chat
 * template), and the optional packages that read them: loaded on first use,
 * so an install without them works until `prefixAware.tokenizer` is configured.
 */
import { readFileSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import type * as HfTokenizers from '@huggingface/tokenizers';
import type * as HfJinja from '@huggingface/jinja';
import { requireOptional } from '../optional-deps';

const INSTALL = 'npm install @huggingface/tokenizers @huggingface/jinja';

/** The two files' parsed JSON. */
export interface TokenizerFiles {
  /** `tokenizer.json`. */
  tokenizer: Record<string, unknown>;
  /** `tokenizer_config.json` (its chat template, special tokens); `{}` when absent. */
  config: Record<string, unknown>;
  /** Where they came from, for messages. */
  source: string;
}

/**
 * Reads a tokenizer: `path` is a directory holding `tokenizer.json` (and, for chat requests,
 * `tokenizer_config.json`), or the path of `tokenizer.json` itself, or both paths. Throws an
 * Error naming the missing file.
 */
export function readTokenizerFiles(path: string | readonly [tokenizerJson: string, tokenizerConfigJson: string]): TokenizerFiles {
  let tokenizerPath: string;
  let configPath: string | undefined;
  if (typeof path !== 'string') {
    [tokenizerPath, configPath] = path;
  } else if (isDirectory(path)) {
    tokenizerPath = join(path, 'tokenizer.json');
    configPath = join(path, 'tokenizer_config.json');
  } else {
    tokenizerPath = path;
    configPath = join(path, '..', 'tokenizer_config.json');
    if (basename(path) === 'tokenizer_config.json') {
      throw new Error(`${path} is the tokenizer's config; name tokenizer.json or the directory holding both`);
    }
  }
  const tokenizer = readJson(tokenizerPath, true);
  const config = (configPath !== undefined && readJson(configPath, typeof path !== 'string')) || {};
  return { tokenizer: tokenizer as Record<string, unknown>, config, source: typeof path === 'string' ? path : path.join(', ') };
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

function readJson(path: string, required: boolean): Record<string, unknown> | undefined {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    if (!required && (error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new Error(`cannot read ${path}: ${(error as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new Error(`${path} is not JSON: ${(error as Error).message}`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error(`${path} does not hold a JSON object`);
  return value as Record<string, unknown>;
}

let tokenizers: typeof HfTokenizers | undefined;
let jinja: typeof HfJinja | undefined;

/** `@huggingface/tokenizers`, or an Error naming the install command. */
export function loadTokenizersPackage(): typeof HfTokenizers {
  tokenizers ??= load<typeof HfTokenizers>('@huggingface/tokenizers');
  return tokenizers;
}

/** `@huggingface/jinja`, or an Error naming the install command. */
export function loadJinjaPackage(): typeof HfJinja {
  jinja ??= load<typeof HfJinja>('@huggingface/jinja');
  return jinja;
}

function load<T>(name: string): T {
  return requireOptional<T>(name, 'Tokenizing prompts needs', INSTALL);
}

/**
 * Every added token (so a cut never falls inside a longer one that overlaps it), each with its
 * id when it is a safe cut point: matched verbatim in the raw text with no strip, word or
 * normalizer rule that could reach across the cut; `undefined` otherwise.
 */
export function addedTokens(tokenizer: Record<string, unknown>): Map<string, number | undefined> {
  const tokens = new Map<string, number | undefined>();
  const added = tokenizer.added_tokens;
  if (!Array.isArray(added)) return tokens;
  for (const token of added as Array<Record<string, unknown>>) {
    if (typeof token.content !== 'string' || token.content === '' || !Number.isSafeInteger(token.id)) continue;
    const clean = token.normalized !== true && token.lstrip !== true && token.rstrip !== true && token.single_word !== true;
    tokens.set(token.content, clean ? (token.id as number) : undefined);
  }
  return tokens;
}

/** Longest first, so the leftmost match is also the longest, as the tokenizer's own matcher takes it. */
export function alternation(literals: string[]): RegExp {
  const sorted = literals.sort((a, b) => b.length - a.length);
  return new RegExp(sorted.map((literal) => literal.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')).join('|'), 'g');
}

/** The chat template `tokenizer_config.json` names (vLLM's default of a named list). */
export function chatTemplateOf(config: Record<string, unknown>): string | undefined {
  const template = config.chat_template;
  if (typeof template === 'string') return template;
  // The list form names several templates; vLLM's default is the one named "default".
  if (Array.isArray(template)) {
    const named = template.find((entry) => entry?.name === 'default') as { template?: unknown } | undefined;
    if (typeof named?.template === 'string') return named.template;
  }
  return undefined;
}
