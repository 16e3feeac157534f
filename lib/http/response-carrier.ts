import { IncomingMessage, type ServerResponse } from 'node:http';
import type { DpRankDecision } from '../types';

/** Where the router keeps a request's state on its response: keys of its own, each a symbol. */
export type Carrier = Record<symbol, unknown>;

/**
 * Express's `res.locals`, the per-response dictionary it makes for such data, or the response
 * itself without Express. Not the response under Express 5: its router adds properties to every
 * request and response after setting their prototype, which leaves each with a hidden class of
 * its own (expressjs/express#5998), and a property added to one builds yet another (about
 * 17,000 instructions); a key added to `res.locals` (a dictionary) costs a few hundred.
 */
export function carrierOf(res: ServerResponse): Carrier {
  const { locals } = res as { locals?: unknown };
  return (typeof locals === 'object' && locals !== null ? locals : res) as unknown as Carrier;
}

/** The key of `req.dpRank` in `res.locals`: one for every copy of this package in the process, which share the accessor. */
const DECISION = Symbol.for('express-dp-router.dpRank');

/** Marks the accessor as this package's, so that no copy installs it twice or over someone else's. */
const OURS = Symbol.for('express-dp-router.dpRank.accessor');

/** `req.dpRank`, read from the response's `res.locals`. */
function getDpRank(this: IncomingMessage & { res?: { locals?: Carrier } }): unknown {
  return this.res?.locals?.[DECISION];
}
(getDpRank as unknown as Record<symbol, boolean>)[OURS] = true;

/** Set, `req.dpRank` becomes the request's own property, as it would be without the accessor. */
function setOwnDpRank(this: IncomingMessage, value: unknown): void {
  Object.defineProperty(this, 'dpRank', { value, writable: true, enumerable: true, configurable: true });
}

/** The prototype last seen, and whether its requests carry `dpRank` in `res.locals`. */
let lastPrototype: object | null = null;
let lastInLocals = false;

/**
 * Sets `req.dpRank` without adding a property to an Express request (see {@link carrierOf}):
 * the first Express request seen installs an accessor on Express's own request prototype (the
 * one below every app's, so that a parent app and a mounted one both see it), and each request's
 * decision goes into its `res.locals`. Without Express, or where `dpRank` is someone else's on
 * the prototype, it is the request's own property, as before.
 */
export function setDpRank(req: IncomingMessage & { dpRank?: DpRankDecision }, res: ServerResponse, carrier: Carrier, decision: DpRankDecision): void {
  if (carrier !== (res as unknown as Carrier)) {
    const prototype = Object.getPrototypeOf(req) as object | null;
    if (prototype !== lastPrototype) {
      lastInLocals = prepare(req, res, prototype);
      lastPrototype = prototype;
    }
    if (lastInLocals) {
      carrier[DECISION] = decision;
      return;
    }
  }
  req.dpRank = decision;
}

/** Whether requests of `prototype` can carry `dpRank` in `res.locals`: installs the accessor where it is missing. */
function prepare(req: IncomingMessage, res: ServerResponse, prototype: object | null): boolean {
  // The getter finds the response by `req.res`, which Express sets on every request.
  if ((req as { res?: unknown }).res !== res) return false;
  let base = prototype;
  while (base !== null) {
    // A `dpRank` of someone else's on the way would hide the accessor.
    const present = Object.getOwnPropertyDescriptor(base, 'dpRank');
    if (present !== undefined) return (present.get as unknown as Record<symbol, boolean> | undefined)?.[OURS] === true;
    const below = Object.getPrototypeOf(base) as object | null;
    if (below === IncomingMessage.prototype) break;
    base = below;
  }
  if (base === null) return false;
  Object.defineProperty(base, 'dpRank', { get: getDpRank, set: setOwnDpRank, enumerable: false, configurable: true });
  return true;
}
