import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { PrefixPickContext } from '../policies/prefix-aware';
import type { RouteEndpoint } from '../upstreams/endpoints';
import { sloPicking, type SloRouting, type SloTicket } from './slo-routing';

declare module '../request/route-slots' {
  /** SLO routing's slot on a request (`RouteState.slo`): its objectives, the prediction made for it, what it teaches. */
  interface RouteSlots {
    slo: SloTicket;
  }
}

/** What SLO routing reads of a request's state. */
interface SloCarrier {
  slo: SloTicket | undefined;
  readonly started: number;
  readonly ticket?: { readonly tenant: string; deadline: number } | undefined;
  readonly headers: IncomingHttpHeaders;
}

/**
 * SLO routing on the request's way (request/route-hooks.ts): the objectives taken (and their
 * headers removed) at the front, the pick steered by them, a shed answered before anything goes
 * upstream, the predicted TTFT in the decision header, the stream's timings learned, and the
 * prompt counted at its rank taken back when no 2xx answer came.
 */
export function sloHooks(slo: SloRouting) {
  return {
    name: 'slo',
    front(route: SloCarrier, req: IncomingMessage, headers: IncomingHttpHeaders): void {
      route.slo = slo.ticket(headers, slo.trusts(req));
    },
    picking(route: SloCarrier, req: IncomingMessage, context: PrefixPickContext, body: Buffer | undefined, members: Readonly<Record<string, unknown>> | undefined): PrefixPickContext {
      return route.slo === undefined ? context : sloPicking(route.slo, context, req, route, body, members);
    },
    refuses(route: SloCarrier, res: ServerResponse): boolean {
      if (route.slo?.shed !== true) return false;
      slo.answerShed(res, route.slo);
      return true;
    },
    note: (route: SloCarrier): string => route.slo?.note ?? '',
    answered(route: SloCarrier, endpoint: RouteEndpoint, _req: IncomingMessage, res: ServerResponse, answer: IncomingMessage): void {
      route.slo?.answered(endpoint, answer, res, route.started);
    },
    firstToken(route: SloCarrier, _endpoint: RouteEndpoint, seconds: number, streamed: boolean): void {
      if (streamed) route.slo?.firstToken(seconds);
    },
    watchesFirstToken: (route: SloCarrier): boolean => route.slo !== undefined,
    closed(route: SloCarrier, _endpoint: RouteEndpoint, answer: IncomingMessage | null | undefined): void {
      route.slo?.closed(answer);
    },
  };
}
