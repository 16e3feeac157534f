import type { ServerResponse } from 'node:http';
import { Admission, AdmissionTicket } from '../../lib/admission/admission';
import { NO_ADMISSION_METRICS } from '../../lib/admission/metrics';
import { parseAdmission } from '../../lib/admission/options';
import { EndpointTable } from '../../lib/upstreams/endpoints';
import { parseUpstreams } from '../../lib/upstreams/upstream-options';

/**
 * The cost of handing one freed slot to the next waiter, with `waiting` requests queued across
 * `tenants` tenants in three classes: µs per release, the queue's own work (the policy pick
 * over free endpoints and what the released request does next are not in it).
 */
export function releaseCost(waiting: number, tenants: number): { enqueueUs: number; releaseUs: number } {
  const table = new EndpointTable(parseUpstreams('upstreams', [{ url: 'http://127.0.0.1:1', dataParallelSize: 1 }]));
  const settings = parseAdmission('admission', { maxInflightPerRank: 1, queue: { maxLength: waiting, timeoutMs: 3_600_000 }, tenant: { header: 'x-tenant-id', trust: true }, priority: {} })!;
  const admission = new Admission({ ...settings, maxPerTenant: waiting }, table, { metrics: NO_ADMISSION_METRICS, warn: () => undefined, error: () => undefined });
  const [endpoint] = table.all;
  endpoint.inflight = 1;
  const res = { once: () => undefined } as unknown as ServerResponse;
  // The released request takes the slot, as the router's assign would; it ends at once.
  const resume = () => endpoint.inflight++;
  const enqueueStart = process.hrtime.bigint();
  for (let i = 0; i < waiting; i++) {
    admission.wait(res, new AdmissionTicket(`tenant-${i % tenants}`, i % 3, undefined), undefined, undefined, (free) => free[0], resume);
  }
  const enqueueNs = Number(process.hrtime.bigint() - enqueueStart);
  const start = process.hrtime.bigint();
  for (let i = 0; i < waiting; i++) {
    endpoint.inflight--;
    admission.freed(endpoint);
  }
  const ns = Number(process.hrtime.bigint() - start);
  if (admission.depth !== 0) throw new Error(`${admission.depth} still waiting`);
  return { enqueueUs: enqueueNs / waiting / 1000, releaseUs: ns / waiting / 1000 };
}
