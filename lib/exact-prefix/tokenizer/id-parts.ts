/**
 * A prompt's token ids as the arrays they come in (cached pieces, added tokens), joined once at
 * the end. Array.prototype.concat copies fast arrays whole; pushing each piece's ids into a
 * growing array, spread or one by one, cost about 44 instructions an id (an 8 KB prompt of
 * 5,800 ids: 250 k instructions, against 60 k joined).
 */

/** The most arrays given to one concat() call: spread arguments live on the stack. */
const MAX_ARGUMENTS = 16_384;
const NONE: readonly number[] = [];

/** Joined ids → the arrays they were joined from (see {@link partsOf}). */
const joinedFrom = new WeakMap<readonly number[], readonly (readonly number[])[]>();

/**
 * The arrays `ids` was joined from by {@link IdParts.join}, in order, or `undefined`. They are
 * the tokenizer's cached arrays, never changed: two prompts joined from the same array at the
 * same place hold the same ids there, which a comparison of arrays tells without one of ids.
 */
export function partsOf(ids: readonly number[]): readonly (readonly number[])[] | undefined {
  return joinedFrom.get(ids);
}

/** Token ids collected as arrays; an added array is read at the join, so it must not change before. */
export class IdParts {
  private readonly parts: (readonly number[])[] = [];

  /** Where the next array goes: what {@link since} starts from. */
  get mark(): number {
    return this.parts.length;
  }

  add(ids: readonly number[]): void {
    if (ids.length > 0) this.parts.push(ids);
  }

  /** The ids added since `mark`, in a new array. */
  since(mark: number): number[] {
    return joined(mark === 0 ? this.parts : this.parts.slice(mark));
  }

  /** All the ids, in a new array ({@link partsOf} tells what it was joined from). */
  join(): number[] {
    const ids = joined(this.parts);
    joinedFrom.set(ids, this.parts);
    return ids;
  }
}

function joined(parts: readonly (readonly number[])[]): number[] {
  if (parts.length <= MAX_ARGUMENTS) return NONE.concat(...parts);
  let ids: number[] = [];
  for (let at = 0; at < parts.length; at += MAX_ARGUMENTS) ids = ids.concat(...parts.slice(at, at + MAX_ARGUMENTS));
  return ids;
}
