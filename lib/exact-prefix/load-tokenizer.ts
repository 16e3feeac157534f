import { fail } from '../option-checks';
import type { TokenizerSource } from './events/source';
import { OptionalPackageError } from './optional-deps';
import { PromptTokenizer } from './tokenizer/tokenizer';

/**
 * Loads `prefixAware.tokenizer` at the router's creation, so that a wrong path fails then. Apart
 * from options.ts: the tokenizer's declarations name `@huggingface/*` types, optional packages a
 * TypeScript consumer without exact routing does not install.
 */
export function loadTokenizer(path: string, source: TokenizerSource, chatTemplateKwargs?: Readonly<Record<string, unknown>>): PromptTokenizer {
  try {
    return PromptTokenizer.load(source, { chatTemplateKwargs });
  } catch (error) {
    // The files may be right: what is missing is a package.
    if (error instanceof OptionalPackageError) return fail(path, `cannot be read: ${error.problem}`, `${error.install}.`);
    return fail(path, `could not be loaded: ${(error as Error).message}`, "Point it at the model's tokenizer.json and tokenizer_config.json (the files the engine serves).");
  }
}
