/**
 * Why a request's prompt is not tokenized in the router (it is then routed on the approximate
 * index), as objects so that no rendered text can be mistaken for one.
 */

/**
 * `invalid` (vLLM would refuse it too), `unsupported` (images, a client's own template, a
 * model whose chat vLLM does not render with a template), `template_error` (the template
 * raised), `too_long` (more new text than the tokenizer's `maxUncachedChars`).
 */
export type RenderRefusal = 'invalid' | 'unsupported' | 'template_error' | 'too_long';

/** A refusal. */
export interface Refused {
  refused: RenderRefusal;
}

export const INVALID: Refused = Object.freeze({ refused: 'invalid' });
export const UNSUPPORTED: Refused = Object.freeze({ refused: 'unsupported' });
export const TEMPLATE_ERROR: Refused = Object.freeze({ refused: 'template_error' });
export const TOO_LONG: Refused = Object.freeze({ refused: 'too_long' });

const BY_KIND: Record<RenderRefusal, Refused> = { invalid: INVALID, unsupported: UNSUPPORTED, template_error: TEMPLATE_ERROR, too_long: TOO_LONG };

/** The refusal of `kind`. */
export function refusal(kind: RenderRefusal): Refused {
  return BY_KIND[kind];
}

/** Whether `value` is one of the refusals above (never a message or a text). */
export function isRefused(value: unknown): value is Refused {
  return value === INVALID || value === UNSUPPORTED || value === TEMPLATE_ERROR || value === TOO_LONG;
}
