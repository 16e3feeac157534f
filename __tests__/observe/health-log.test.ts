import { describe, expect, it } from '@jest/globals';
import { closedAfterEach, echoUpstreams, startGateway, waitFor } from '../helpers';

const echo = echoUpstreams();
const started = closedAfterEach();

/** Makes `upstream` answer its health probe with `status` while `sick()` says so (every other request 200); counts probes. */
function probed(upstream: Awaited<ReturnType<typeof echo>>, sick: () => boolean, status: number): { count: number } {
  const probes = { count: 0 };
  upstream.respond = (req, res) => {
    if (req.url === '/health') probes.count++;
    res.writeHead(req.url === '/health' && sick() ? status : 200);
    res.end('{}');
  };
  return probes;
}

describe('health check transitions in the log', () => {
  it('warns once when an upstream goes down and says at info once when it comes back, with upstream and ranks', async () => {
    const sick = await echo();
    const well = await echo();
    let healthy = true;
    const probes = probed(sick, () => !healthy, 503);
    const warnings: string[] = [];
    const infos: Array<{ fields: object; message: string }> = [];
    const logger = { warn: (message: string) => warnings.push(message), info: (fields: object, message: string) => infos.push({ fields, message }) };
    const gateway = await startGateway({
      upstreams: [
        { url: sick.url, name: 'sick', dataParallelSize: 4, ranks: [0, 2, 3] },
        { url: well.url, name: 'well', startRank: 4 },
      ],
      healthCheck: { intervalMs: 10, unhealthyThreshold: 2 },
      logger,
    });
    started.push(gateway);
    await waitFor(() => probes.count >= 2);
    expect(warnings).toEqual([]);
    expect(infos).toEqual([]);

    healthy = false;
    await waitFor(() => gateway.router.endpoints().every((endpoint) => endpoint.upstream !== 'sick' || !endpoint.healthy));
    const downAt = probes.count;
    // Probes keep failing: still one line.
    await waitFor(() => probes.count >= downAt + 3);
    expect(warnings).toEqual([`express-dp-router: upstream 'sick' failed 2 health checks in a row (GET /health): ranks 0, 2, 3 out of rotation`]);

    healthy = true;
    await waitFor(() => gateway.router.endpoints().every((endpoint) => endpoint.healthy));
    const upAt = probes.count;
    await waitFor(() => probes.count >= upAt + 3);
    expect(infos).toEqual([
      {
        fields: { dpRank: { upstream: 'sick', ranks: [0, 2, 3] } },
        message: `express-dp-router: upstream 'sick' passes its health check again (1 × GET /health): ranks 0, 2, 3 back in rotation`,
      },
    ]);
    expect(warnings).toHaveLength(1);
  });

  it('names each upstream entry behind one probed URL', async () => {
    const shared = await echo();
    let healthy = true;
    probed(shared, () => !healthy, 500);
    const warnings: string[] = [];
    const gateway = await startGateway({
      upstreams: [
        { url: shared.url, name: 'a', dataParallelSize: 2 },
        { url: shared.url, name: 'b', startRank: 2, dataParallelSize: 2 },
      ],
      healthCheck: { intervalMs: 10, unhealthyThreshold: 1 },
      logger: { warn: (message) => warnings.push(message) },
    });
    started.push(gateway);
    healthy = false;
    await waitFor(() => warnings.length >= 2);
    expect(warnings.sort()).toEqual([
      `express-dp-router: upstream 'a' failed 1 health check in a row (GET /health): ranks 0, 1 out of rotation`,
      `express-dp-router: upstream 'b' failed 1 health check in a row (GET /health): ranks 2, 3 out of rotation`,
    ]);
  });

  it("tells the prefill pool's changes too, each upstream once whichever pools it serves", async () => {
    const prefill = await echo();
    const both = await echo();
    const decode = await echo();
    let healthy = true;
    for (const upstream of [prefill, both]) probed(upstream, () => !healthy, 503);
    const warnings: string[] = [];
    const gateway = await startGateway({
      upstreams: [
        { url: prefill.url, name: 'p', role: 'prefill' },
        { url: both.url, name: 'b', role: 'both' },
        { url: decode.url, name: 'd', role: 'decode' },
      ],
      disaggregation: { prefillPolicy: 'round-robin' },
      healthCheck: { intervalMs: 10, unhealthyThreshold: 1 },
      logger: { warn: (message) => warnings.push(message) },
    });
    started.push(gateway);
    healthy = false;
    // Both pools probe 'b': once each has taken it out, every line there will be is written.
    await waitFor(() => gateway.router.endpoints().every((endpoint) => endpoint.upstream === 'd' || !endpoint.healthy));
    expect(warnings.sort()).toEqual([
      `express-dp-router: upstream 'b' failed 1 health check in a row (GET /health): ranks 0 out of rotation`,
      `express-dp-router: upstream 'p' failed 1 health check in a row (GET /health): ranks 0 out of rotation`,
    ]);
  });
});
