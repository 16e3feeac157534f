import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { RouteEndpoint } from '../upstreams/endpoints';
import type { Slot } from './route-slots';

/** What the gate reads and keeps of a request (its `RouteState`). */
export interface GatedRoute {
  ticket: Slot<'ticket'> | undefined;
  leave: (() => void) | undefined;
  readonly pool: readonly RouteEndpoint[] | undefined;
  readonly body: Buffer | undefined;
  readonly bodyHead: Buffer | undefined;
  readonly headers: IncomingHttpHeaders;
  /** The body's members, when routing decoded it whole: the token estimate reads its limits there. */
  readonly view: { readonly members: Readonly<Record<string, unknown>> | undefined } | undefined;
}

/**
 * The lifecycle's admission stage, as the core calls it (admission/admission.ts's `Admission`
 * is the one implementation): a ticket before the body is read, a token reservation and a seat
 * once an endpoint is chosen, room for a retry. Its accounting on the way back (tokens counted,
 * slots freed) is registered on the route hooks instead (compose/features.ts).
 */
export interface Gate {
  /** Whether a token budget counts answers (a reservation precedes the seat). */
  readonly counts: boolean;
  /** The priority classes a ticket's `priority` indexes. */
  readonly settings: { readonly classes: readonly string[] };
  /** The request's ticket; `undefined` when it was answered here. */
  admit(req: IncomingMessage, res: ServerResponse, trusted: boolean): Slot<'ticket'> | undefined;
  /** Reserves the request's token estimate, then `go` (or answers 429). */
  reserve(res: ServerResponse, route: GatedRoute, go: () => void): void;
  /** A slot on `chosen` (or another with room, by `choose`), then `go`; the function that takes it out of the queue while it waits. */
  seat(
    res: ServerResponse,
    route: GatedRoute,
    chosen: RouteEndpoint,
    hinted: boolean,
    choose: (free: readonly RouteEndpoint[]) => RouteEndpoint | undefined,
    go: (endpoint: RouteEndpoint) => void,
    failed: (error: unknown) => void,
  ): (() => void) | undefined;
  /** A request went to an endpoint that holds no rank's slot (vLLM balances it). */
  admitted(): void;
  /** Whether `endpoint` has no room (a retry goes only where there is). */
  full(endpoint: RouteEndpoint): boolean;
}
