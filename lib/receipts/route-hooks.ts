import type { IncomingMessage, ServerResponse } from 'node:http';
import type { RouteTicket } from '../policies/pick-ticket';
import type { PickResult } from '../policies/pick-result';
import type { RouteEndpoint } from '../upstreams/endpoints';
import type { ReceiptCarrier, Receipts } from './receipts';

declare module '../request/route-slots' {
  /** Route receipts' slot on a request (`RouteState.receipt`): what its receipts are judged against; a retry drops it. */
  interface RouteSlots {
    receipt: RouteTicket;
  }
}

/**
 * Route receipts on the request's way (request/route-hooks.ts, receipts.ts says what each
 * does): the pick's ticket, whether the rank header is sent, the answer's usage, the closed
 * response's KV receipt. A retry drops the ticket: a second pick is judged on nothing.
 */
export function receiptHooks(receipts: Receipts) {
  return {
    name: 'receipts',
    decided(route: ReceiptCarrier, found: PickResult<RouteEndpoint>, context: { readonly exact?: { readonly ticket?: RouteTicket } }, members: Readonly<Record<string, unknown>> | undefined, prompted: boolean): void {
      receipts.decided(route, found.endpoint, context.exact?.ticket, members, prompted ? found.matchedShare : undefined);
    },
    claims: (route: ReceiptCarrier, endpoint: RouteEndpoint): boolean => receipts.claims(endpoint, route.receipt),
    retrying(route: ReceiptCarrier): void {
      route.receipt = undefined;
    },
    answered(route: ReceiptCarrier, endpoint: RouteEndpoint, req: IncomingMessage, res: ServerResponse, answer: IncomingMessage): void {
      if (route.receipt !== undefined) receipts.answered(route.receipt, endpoint, req, res, answer);
    },
    closed(route: ReceiptCarrier, _endpoint: RouteEndpoint, answer: IncomingMessage | null | undefined): void {
      if (route.receipt !== undefined) receipts.closed(route.receipt, answer);
    },
  };
}
