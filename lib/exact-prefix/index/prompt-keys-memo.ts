/**
 * The block keys of the last prompt an index was asked about, for the next prompt to take up
 * as far as the two share full blocks. Requests behind one system prompt or document come in
 * runs, and hashing a block (one keyed-hash round per token) costs about 8 times what
 * comparing its ids with the last prompt's does: an 8 KB prompt whose blocks were all hashed
 * for the request before costs a comparison of its ids and a copy of its keys.
 *
 * Comparing ids is exact, so no prompt can borrow another's keys by collision; what it holds is
 * one prompt's id array and keys (about 8 bytes an id) per index.
 */
import type { BlockKeys } from './block-keys';

const floor = Math.floor;

/** One index's memo of the last prompt's block keys. */
export class PromptKeysMemo {
  private tokens: ArrayLike<number> = [];
  private parts: readonly (readonly number[])[] | undefined;
  private keys: BlockKeys = { size: 0, loraName: undefined, values: [] };

  /**
   * Keys for `tokens`, to hand to `match()` and `speculate()`: they start with the last prompt's
   * keys of the full blocks both share (as computed for its block size and adapter: `keysFor`
   * empties them for another), and are what the next prompt is compared with. `parts`, when
   * given, are arrays `tokens` is the concatenation of, none of them ever changed: where both
   * prompts have the same array at the same place, their ids are not compared one by one.
   */
  keysFor(tokens: ArrayLike<number>, parts?: readonly (readonly number[])[]): BlockKeys {
    const last = this.keys;
    const size = last.size;
    let values: number[];
    if (size === 0 || last.values.length === 0) values = [];
    else {
      const previous = this.tokens;
      const end = floor(tokens.length / size) < last.values.length ? floor(tokens.length / size) * size : last.values.length * size;
      let same = 0;
      const before = this.parts;
      if (parts !== undefined && before !== undefined) {
        for (let at = 0; at < parts.length && at < before.length && parts[at] === before[at] && same + parts[at].length <= end; at++) same += parts[at].length;
      }
      while (same < end && tokens[same] === previous[same]) same++;
      values = last.values.slice(0, floor(same / size));
    }
    const keys: BlockKeys = { size, loraName: last.loraName, salt: last.salt, values };
    this.tokens = tokens;
    this.parts = parts;
    this.keys = keys;
    return keys;
  }
}
