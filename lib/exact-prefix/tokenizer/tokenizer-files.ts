/**
 * The model's tokenizer files (and what tokenizer.ts reads from them: added tokens, the chat
 * template), and the optional packages that read them: loaded on first use,
 * so an install without them works until `prefixAware.tokenizer` is configured.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type * as HfTokenizers from '@huggingface/tokenizers';
import type * as HfJinja from '@huggingface/jinja';
import { requireOptional } from '../optional-deps';

/** The two files' parsed JSON. */
export interface TokenizerFiles {
  /** `tokenizer.json`. */
  tokenizer: Record<string, unknown>;
  /** `tokenizer_config.json` (its chat template, special tokens); `{}` when absent. */
  config: Record<string, unknown>;
  /** The templates of `chat_template.jinja` (`default`) and `chat_templates/NAME.jinja` beside it, which transformers puts before the config's; absent when there are none. */
  templateFiles?: ChatTemplates;
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
  const templateFiles = readTemplateFiles(dirname(configPath ?? tokenizerPath));
  return { tokenizer: tokenizer as Record<string, unknown>, config, source: typeof path === 'string' ? path : path.join(', '), ...(templateFiles && { templateFiles }) };
}

/** The model's chat templates by name: `default` for a single one. */
export type ChatTemplates = Readonly<Record<string, string>>;

/** transformers' template files in a model directory (tokenization_utils_base.py, `chat_template_file`, `CHAT_TEMPLATE_DIR`). */
function readTemplateFiles(directory: string): ChatTemplates | undefined {
  const templates: Record<string, string> = {};
  const single = readText(join(directory, 'chat_template.jinja'));
  if (single !== undefined) templates.default = single;
  let named: string[] = [];
  try {
    named = readdirSync(join(directory, 'chat_templates')).filter((name) => name.endsWith('.jinja'));
  } catch {
    // No such directory: the usual case.
  }
  for (const file of named) {
    const text = readText(join(directory, 'chat_templates', file));
    if (text !== undefined) Object.defineProperty(templates, file.slice(0, -'.jinja'.length), { value: text, enumerable: true });
  }
  return Object.keys(templates).length === 0 ? undefined : templates;
}

function readText(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new Error(`cannot read ${path}: ${(error as Error).message}`);
  }
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

/** `@huggingface/tokenizers`, or an `OptionalPackageError` naming the install command. */
export function loadTokenizersPackage(): typeof HfTokenizers {
  tokenizers ??= load<typeof HfTokenizers>('@huggingface/tokenizers');
  return tokenizers;
}

/** `@huggingface/jinja`, or an `OptionalPackageError` naming the install command. */
export function loadJinjaPackage(): typeof HfJinja {
  jinja ??= load<typeof HfJinja>('@huggingface/jinja');
  return jinja;
}

function load<T>(name: string): T {
  return requireOptional<T>(name, 'Tokenizing prompts needs');
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

/**
 * The model's chat templates as transformers loads them: the template files when there are
 * any, else `tokenizer_config.json`'s `chat_template` (a string, or a list of named ones).
 */
export function chatTemplatesOf(files: TokenizerFiles): ChatTemplates | undefined {
  if (files.templateFiles !== undefined) return files.templateFiles;
  const template = files.config.chat_template;
  if (typeof template === 'string') return { default: template };
  if (!Array.isArray(template)) return undefined;
  const named: Record<string, string> = {};
  for (const entry of template) {
    if (typeof entry?.name === 'string' && typeof entry?.template === 'string') Object.defineProperty(named, entry.name, { value: entry.template, enumerable: true });
  }
  return Object.keys(named).length === 0 ? undefined : named;
}
