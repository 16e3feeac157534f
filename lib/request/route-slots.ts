/**
 * What features keep on one request: one member of `RouteState` each, typed by the feature that
 * owns it through declaration merging (as fastify's plugins decorate its request), so that the
 * core declares the slot (a fixed-shape object, no map per request) and names no feature's
 * type. A feature declares its slot next to its hooks:
 *
 *   declare module '../request/route-slots' {
 *     interface RouteSlots { ticket: AdmissionTicket }
 *   }
 *
 * and adds the member to `RouteState` (`ticket: Slot<'ticket'> | undefined = undefined`).
 */
export interface RouteSlots {}

/** A slot's type: `unknown` where the feature's declaration is not loaded (a program that type-checks `RouteState` alone). */
export type Slot<K extends string> = K extends keyof RouteSlots ? RouteSlots[K] : unknown;
