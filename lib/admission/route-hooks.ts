import type { IncomingMessage } from 'node:http';
import type { RouteEndpoint } from '../upstreams/endpoints';
import type { Admission, AdmissionTicket } from './admission';

declare module '../request/route-slots' {
  /** Admission's slot on a request (`RouteState.ticket`); `undefined` without `admission`. */
  interface RouteSlots {
    ticket: AdmissionTicket;
  }
}

/** What admission keeps on a request. */
interface TicketCarrier {
  ticket: AdmissionTicket | undefined;
}

/**
 * Admission's accounting on the request's way (request/route-hooks.ts); the queue and the
 * token budget are stages of the lifecycle itself. An answer's tokens are counted as it
 * flows (a token budget); a slot freed (a retry moved on, the response closed) may seat a
 * waiting request. A balanced endpoint holds no rank's slot.
 */
export function admissionHooks(admission: Admission) {
  return {
    name: 'admission',
    answered(route: TicketCarrier, _endpoint: RouteEndpoint, _req: IncomingMessage, _res: unknown, answer: IncomingMessage): void {
      if (route.ticket !== undefined && admission.counts) admission.count(route.ticket, answer);
    },
    retried(_route: TicketCarrier, from: RouteEndpoint): void {
      if (!from.balanced) admission.freed(from);
    },
    closing(route: TicketCarrier): void {
      route.ticket?.ended();
    },
    closed(_route: TicketCarrier, endpoint: RouteEndpoint): void {
      if (!endpoint.balanced) admission.freed(endpoint);
    },
  };
}
