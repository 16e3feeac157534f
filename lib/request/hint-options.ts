import type { IncomingMessage } from 'node:http';
import { fail, fieldNameOption, headerNameOption, oneOf, pathOf, section, shown, type KeysEnum } from '../option-checks';

/** How client rank hints are treated. */
export interface HintOptions {
  /**
   * Whether a caller may name its rank. A function decides per request (e.g. from your own
   * authentication). Untrusted hints are removed and counted `untrusted`. Default: `false`.
   */
  trust?: boolean | ((req: IncomingMessage) => boolean);
  /** What an invalid trusted hint gets: a rank assigned anyway, or a 400. Default: `'reassign'`. */
  onInvalid?: 'reassign' | 'reject';
  /** The incoming hint header. Default: `'x-data-parallel-rank'`. */
  header?: string;
  /** A JSON body field read as a hint (e.g. `'routed_dp_rank'`), or `false`. Default: `false`. */
  bodyField?: string | false;
}

/** `hints`, resolved. */
export interface HintConfig {
  /** `true`/`false` when fixed, else asked per request. */
  readonly trust: boolean | ((req: IncomingMessage) => boolean);
  readonly onInvalid: 'reassign' | 'reject';
  /** Lower-cased, as Node keys `req.headers`. */
  readonly header: string;
  /** `undefined` when off. */
  readonly bodyField: string | undefined;
}

const TRUST = false;
const ON_INVALID = 'reassign';
/** The rank header: where a hint comes in, and (by default) what the router sets. */
export const RANK_HEADER = 'x-data-parallel-rank';
const BODY_FIELD = false;

const HINT_KEYS: KeysEnum<HintOptions> = { trust: true, onInvalid: true, header: true, bodyField: true };

/** `hints`. */
export function parseHints(path: string, value: unknown): HintConfig {
  const hints = section(path, value, HINT_KEYS);
  return {
    trust: parseTrust(pathOf(path, 'trust'), hints.trust),
    onInvalid: oneOf(pathOf(path, 'onInvalid'), hints.onInvalid, ['reassign', 'reject'], ON_INVALID),
    header: headerNameOption(pathOf(path, 'header'), hints.header, RANK_HEADER),
    bodyField: fieldNameOption(pathOf(path, 'bodyField'), hints.bodyField, BODY_FIELD),
  };
}

function parseTrust(path: string, value: unknown): HintConfig['trust'] {
  if (value === undefined) return TRUST;
  if (typeof value === 'boolean' || typeof value === 'function') return value as HintConfig['trust'];
  return fail(path, `must be a boolean or a function (req) => boolean, got ${shown(value)}`, 'Use e.g. `trust: (req) => req.socket.remoteAddress === "127.0.0.1"`.');
}
