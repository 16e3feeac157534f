import { describe, expect, it } from '@jest/globals';
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import pino from 'pino';
import { Registry } from 'prom-client';
import { dpRouter, OptionError } from '../../lib';
import { parseCommandLine, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway } from '../../example-server/gateway';
import { closedAfterEach, closerOf, exchange, startDnsmasq, startGateway, waitFor, type Dnsmasq, type DnsmasqOptions } from '../helpers';

const started = closedAfterEach();

/** Upstreams on several loopback addresses, one port for all (as pods behind a headless Service). */
async function startServers(addresses: readonly string[]) {
  const hits: string[] = [];
  const held: ServerResponse[] = [];
  let hold = false;
  const servers: Server[] = [];
  let port = 0;
  for (const address of addresses) {
    const server = createServer((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        hits.push(address);
        if (hold) {
          held.push(res);
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ address }));
      });
    });
    await new Promise<void>((resolve) => server.listen(port, address, resolve));
    port = (server.address() as AddressInfo).port;
    servers.push(server);
  }
  const closers = servers.map(closerOf);
  const pods = {
    port,
    hits,
    held,
    holdNext: (on: boolean) => (hold = on),
    close: async () => {
      held.forEach((res) => res.destroy());
      await Promise.all(closers.map((close) => close()));
    },
  };
  started.push(pods);
  return pods;
}

/** A logger that keeps every notice, for awaiting the ones discovery writes. */
function notices() {
  const lines: string[] = [];
  return { lines, logger: { warn: (message: string) => lines.push(message) }, has: (text: string) => lines.some((line) => line.includes(text)) };
}

async function dnsmasq(hosts: ReadonlyArray<readonly [string, string]>, options?: DnsmasqOptions): Promise<Dnsmasq> {
  const server = await startDnsmasq(hosts, options);
  started.push(server);
  return server;
}

const resolutions = async (registry: Registry) => {
  const text = await registry.metrics();
  return Object.fromEntries([...text.matchAll(/^dp_router_dns_resolutions_total\{name="([^"]+)",outcome="(\w+)"\} (\d+)$/gm)].map((m) => [`${m[1]} ${m[2]}`, Number(m[3])]));
};

describe('upstreams found by DNS', () => {
  it('makes one upstream per address, follows record changes, lets requests in flight finish, and drops removed series', async () => {
    const pods = await startServers(['127.0.0.2', '127.0.0.3', '127.0.0.4']);
    const dns = await dnsmasq([
      ['127.0.0.2', 'vllm.test'],
      ['127.0.0.3', 'vllm.test'],
    ]);
    const log = notices();
    const gateway = await startGateway({
      upstreams: [{ dns: { name: 'vllm.test', port: pods.port, intervalMs: 50, servers: [dns.server] }, name: 'vllm', dataParallelSize: 2 }],
      policy: 'round-robin',
      logger: log.logger,
    });
    started.push(gateway);
    await waitFor(() => log.has("'vllm.test' resolves to 127.0.0.2, 127.0.0.3"));
    expect(gateway.router.endpoints().map(({ upstream, rank }) => `${upstream}#${rank}`)).toEqual(['vllm/127.0.0.2#0', 'vllm/127.0.0.2#1', 'vllm/127.0.0.3#0', 'vllm/127.0.0.3#1']);
    for (let i = 0; i < 4; i++) expect((await exchange(gateway.url, { body: '{}' })).status).toBe(200);
    expect(new Set(pods.hits)).toEqual(new Set(['127.0.0.2', '127.0.0.3']));

    // A request held open on .3 while .3 leaves the records (those landing on .2 are let go).
    pods.holdNext(true);
    const send = (): Promise<number> =>
      new Promise((resolve) => {
        const sent = request(`${gateway.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        });
        sent.end('{}');
      });
    let inFlight: Promise<number> | undefined;
    for (let turn = 0; turn < 4 && inFlight === undefined; turn++) {
      pods.hits.length = 0;
      const status = send();
      await waitFor(() => pods.hits.length === 1);
      if (pods.hits[0] === '127.0.0.3') inFlight = status;
      else {
        pods.held.shift()!.end('{}');
        expect(await status).toBe(200);
      }
    }
    expect(inFlight).toBeDefined();
    await dns.setHosts([
      ['127.0.0.2', 'vllm.test'],
      ['127.0.0.4', 'vllm.test'],
    ]);
    await waitFor(() => log.has("'vllm.test' resolves to 127.0.0.2, 127.0.0.4"));
    pods.holdNext(false);
    expect(gateway.router.endpoints().map(({ upstream }) => upstream)).toEqual(['vllm/127.0.0.2', 'vllm/127.0.0.2', 'vllm/127.0.0.4', 'vllm/127.0.0.4']);
    pods.held.splice(0).forEach((res) => res.end('{"held":true}'));
    expect(await inFlight!).toBe(200);
    pods.hits.length = 0;
    for (let i = 0; i < 4; i++) expect((await exchange(gateway.url, { body: '{}' })).status).toBe(200);
    expect(new Set(pods.hits)).toEqual(new Set(['127.0.0.2', '127.0.0.4']));

    const text = await gateway.registry.metrics();
    expect(text).not.toMatch(/upstream="vllm\/127\.0\.0\.3"/);
    expect(text).toMatch(/dp_router_requests_total\{upstream="vllm\/127\.0\.0\.4",rank="0",source="assigned"\} \d+/);
    const counts = await resolutions(gateway.registry);
    expect(counts['vllm.test ok']).toBeGreaterThanOrEqual(2);
    expect(counts['vllm.test empty']).toBe(0);
    expect(counts['vllm.test failed']).toBe(0);
  });

  it('has no endpoints for a name that does not exist (503), and keeps the last set through an outage, logged once', async () => {
    const pods = await startServers(['127.0.0.2']);
    const dns = await dnsmasq([['127.0.0.2', 'up.test']]);
    const log = notices();
    const gateway = await startGateway({
      upstreams: [
        { dns: { name: 'up.test', port: pods.port, intervalMs: 30, servers: [dns.server] } },
        { dns: { name: 'missing.test', port: pods.port, intervalMs: 30, servers: [dns.server] }, name: 'gone' },
      ],
      logger: log.logger,
    });
    started.push(gateway);
    await waitFor(async () => (await resolutions(gateway.registry))['missing.test empty'] >= 1 && gateway.router.endpoints().length === 1);
    // Without a `name`, the address is the upstream's name.
    expect(gateway.router.endpoints().map(({ upstream }) => upstream)).toEqual(['127.0.0.2']);

    await dns.stop();
    // Both names are asked on their own timers: wait until each has failed at least once.
    await waitFor(async () => {
      const counts = await resolutions(gateway.registry);
      return counts['up.test failed'] >= 3 && counts['missing.test failed'] >= 1;
    });
    expect(log.lines.filter((line) => line.includes("resolving 'up.test' failed"))).toHaveLength(1);
    expect(log.lines.filter((line) => line.includes("resolving 'missing.test' failed"))).toHaveLength(1);
    expect(gateway.router.endpoints().map(({ upstream }) => upstream)).toEqual(['127.0.0.2']);
    expect((await exchange(gateway.url)).status).toBe(200);

    await dns.setHosts([]).catch(() => undefined);
    await dns.restart();
    await waitFor(() => log.has("'up.test' resolves to no address"));
    expect(log.has("'up.test' resolves again.")).toBe(true);
    const answer = await exchange(gateway.url);
    expect(answer.status).toBe(503);
    expect(JSON.parse(answer.body).error.type).toBe('ServiceUnavailableError');
  });

  it('names an AAAA address as it is and reaches it in brackets', async () => {
    const dns = await dnsmasq([['::1', 'six.test']]);
    const log = notices();
    const router = dpRouter({ upstreams: [{ dns: { name: 'six.test', port: 8000, intervalMs: 1000, servers: [dns.server] } }], metrics: false, logger: log.logger });
    started.push(router);
    await waitFor(() => log.has("'six.test' resolves to ::1"));
    expect(router.endpoints().map(({ upstream }) => upstream)).toEqual(['::1']);
  });

  it('keeps the A answer when AAAA is refused (a dnsmasq without upstream servers), told once', async () => {
    const pods = await startServers(['127.0.0.2', '127.0.0.3']);
    // Not local: dnsmasq forwards the AAAA query it has no record for, to no server: REFUSED.
    const dns = await dnsmasq(
      [
        ['127.0.0.2', 'v4only.test'],
        ['127.0.0.3', 'v4only.test'],
      ],
      { local: false },
    );
    const log = notices();
    const gateway = await startGateway({
      upstreams: [{ dns: { name: 'v4only.test', port: pods.port, intervalMs: 30, servers: [dns.server] }, name: 'pods', models: ['llama'] }],
      policy: 'round-robin',
      logger: log.logger,
    });
    started.push(gateway);
    await waitFor(async () => (await resolutions(gateway.registry))['v4only.test ok'] >= 3);
    expect(gateway.router.endpoints().map(({ upstream }) => upstream)).toEqual(['pods/127.0.0.2', 'pods/127.0.0.3']);
    expect(log.lines.filter((line) => line.includes("resolving 'v4only.test' for AAAA records failed (EREFUSED)"))).toHaveLength(1);
    expect(log.has("resolving 'v4only.test' failed")).toBe(false);
    expect((await resolutions(gateway.registry))['v4only.test failed']).toBe(0);
    for (let i = 0; i < 2; i++) expect((await exchange(gateway.url, { path: '/v1/chat/completions', body: '{"model":"llama","messages":[]}' })).status).toBe(200);
    expect(new Set(pods.hits)).toEqual(new Set(['127.0.0.2', '127.0.0.3']));
  });

  it('answers 503, not 404, for a configured model whose DNS entry has no endpoints', async () => {
    const pods = await startServers(['127.0.0.2']);
    const dns = await dnsmasq([['127.0.0.2', 'llama.test']]);
    const gateway = await startGateway({
      upstreams: [
        { dns: { name: 'llama.test', port: pods.port, intervalMs: 30, servers: [dns.server] }, models: ['llama'] },
        // NXDOMAIN: no endpoints, but its model is known.
        { dns: { name: 'qwen.test', port: pods.port, intervalMs: 30, servers: [dns.server] }, models: ['qwen'] },
      ],
    });
    started.push(gateway);
    await waitFor(async () => (await resolutions(gateway.registry))['qwen.test empty'] >= 1 && gateway.router.endpoints().length === 1);
    const ask = (model: string) => exchange(gateway.url, { path: '/v1/chat/completions', body: JSON.stringify({ model, messages: [] }) });
    expect((await ask('llama')).status).toBe(200);
    const qwen = await ask('qwen');
    expect(qwen.status).toBe(503);
    expect(JSON.parse(qwen.body).error.type).toBe('ServiceUnavailableError');
    const unknown = await ask('mistral');
    expect(unknown.status).toBe(404);
    expect(JSON.parse(unknown.body).error).toMatchObject({ type: 'NotFoundError', param: 'model' });
  });

  it('answers 503 for any model while a DNS entry that serves every model has no endpoints', async () => {
    const pods = await startServers(['127.0.0.2']);
    const dns = await dnsmasq([['127.0.0.2', 'llama.test']]);
    const gateway = await startGateway({
      upstreams: [
        { dns: { name: 'llama.test', port: pods.port, intervalMs: 30, servers: [dns.server] }, models: ['llama'] },
        { dns: { name: 'any.test', port: pods.port, intervalMs: 30, servers: [dns.server] } },
      ],
    });
    started.push(gateway);
    await waitFor(async () => (await resolutions(gateway.registry))['any.test empty'] >= 1 && gateway.router.endpoints().length === 1);
    // Whether any.test's servers serve "qwen" is unknown until they resolve: not a 404.
    const qwen = await exchange(gateway.url, { path: '/v1/chat/completions', body: '{"model":"qwen","messages":[]}' });
    expect(qwen.status).toBe(503);
  });

  it('makes upstreams of at most maxAddresses of one answer (64 by default), the first in sorted order, told once', async () => {
    const addresses = Array.from({ length: 3000 }, (_, i) => `127.1.${Math.floor(i / 250)}.${(i % 250) + 1}`);
    const dns = await dnsmasq(addresses.map((address) => [address, 'many.test'] as const));
    const log = notices();
    const router = dpRouter({
      upstreams: [
        { dns: { name: 'many.test', port: 8000, intervalMs: 30, servers: [dns.server] }, name: 'capped', dataParallelSize: 2 },
        { dns: { name: 'many.test', port: 8001, intervalMs: 30, servers: [dns.server], maxAddresses: 16 }, name: 'small', dataParallelSize: 2 },
      ],
      metrics: { registry: new Registry() },
      logger: log.logger,
    });
    started.push(router);
    const sorted = [...addresses].sort();
    const upstreamsOf = (prefix: string) => [...new Set(router.endpoints().map(({ upstream }) => upstream).filter((name) => name.startsWith(`${prefix}/`)))];
    await waitFor(() => upstreamsOf('capped').length > 0 && upstreamsOf('small').length > 0);
    expect(upstreamsOf('capped')).toEqual(sorted.slice(0, 64).map((address) => `capped/${address}`));
    expect(upstreamsOf('small')).toEqual(sorted.slice(0, 16).map((address) => `small/${address}`));
    expect(router.endpoints()).toHaveLength((64 + 16) * 2);
    // Several answers later (both entries count under the one name), each entry has told it once.
    await waitFor(async () => (await resolutions(router.registry))['many.test ok'] >= 6);
    const told = log.lines.filter((line) => line.includes("'many.test' resolves to 3000 addresses"));
    expect(told.map((line) => /routing to the first (\d+)/.exec(line)![1]).sort()).toEqual(['16', '64']);
  });

  it('setUpstreams() can add and remove DNS entries', async () => {
    const pods = await startServers(['127.0.0.2']);
    const dns = await dnsmasq([['127.0.0.2', 'late.test']]);
    const log = notices();
    const router = dpRouter({ upstreams: [{ url: 'http://127.0.0.9:1', name: 'fixed' }], metrics: false, logger: log.logger });
    started.push(router);
    router.setUpstreams([{ url: 'http://127.0.0.9:1', name: 'fixed' }, { dns: { name: 'late.test', port: pods.port, intervalMs: 1000, servers: [dns.server] } }]);
    await waitFor(() => log.has("'late.test' resolves to 127.0.0.2"));
    expect(router.endpoints().map(({ upstream }) => upstream)).toEqual(['fixed', '127.0.0.2']);
    router.setUpstreams([{ url: 'http://127.0.0.9:1', name: 'fixed' }]);
    expect(router.endpoints().map(({ upstream }) => upstream)).toEqual(['fixed']);
  });

  it('the example server finds its upstreams with --upstream-dns and --dns-server', async () => {
    const pods = await startServers(['127.0.0.2', '127.0.0.3']);
    const dns = await dnsmasq([
      ['127.0.0.2', 'pods.test'],
      ['127.0.0.3', 'pods.test'],
    ]);
    const settings = parseCommandLine(['--upstream-dns', `pods.test:${pods.port}`, '--dns-server', dns.server, '--dp-size', '1', '--port', '0', '--policy', 'round-robin']) as GatewaySettings;
    const gateway = await startExampleGateway({ ...settings, drainTimeoutMs: 100 });
    started.push(gateway);
    expect(gateway.summary).toContain(`every address of pods.test:${pods.port}`);
    await waitFor(() => gateway.router.endpoints().length === 2);
    for (let i = 0; i < 2; i++) expect((await exchange(gateway.url, { body: '{}' })).status).toBe(200);
    expect(new Set(pods.hits)).toEqual(new Set(['127.0.0.2', '127.0.0.3']));
  });

  it('the example server names each address of --upstream-dns NAME/ADDRESS: entries resolving to one address stay apart', async () => {
    const [first, second] = [await startServers(['127.0.0.2']), await startServers(['127.0.0.2'])];
    const dns = await dnsmasq([
      ['127.0.0.2', 'a.test'],
      ['127.0.0.2', 'b.test'],
    ]);
    const lines: string[] = [];
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
    const argv = ['--upstream-dns', `a.test:${first.port}`, '--upstream-dns', `b.test:${second.port}`, '--upstream-dns', `b.test:${first.port}`];
    const settings = parseCommandLine([...argv, '--dns-server', dns.server, '--dp-size', '1', '--port', '0', '--policy', 'round-robin']) as GatewaySettings;
    const gateway = await startExampleGateway({ ...settings, drainTimeoutMs: 100 }, logger);
    started.push(gateway);
    await waitFor(() => gateway.router.endpoints().length === 3);
    // b.test is given with two ports: its upstreams carry the port too.
    expect(gateway.router.endpoints().map(({ upstream }) => upstream)).toEqual(['a.test/127.0.0.2', `b.test:${second.port}/127.0.0.2`, `b.test:${first.port}/127.0.0.2`]);
    expect(lines.filter((line) => line.includes('two upstreams would be named'))).toEqual([]);
    for (let i = 0; i < 3; i++) expect((await exchange(gateway.url, { body: '{}' })).status).toBe(200);
    expect([first.hits.length, second.hits.length]).toEqual([2, 1]);
  });

  it.each([
    [{ url: 'http://127.0.0.1:8000', dns: { name: 'a.test', port: 8000 } }, 'upstreams[0]` gives both `url` and `dns`'],
    [{ dns: { name: 'bad name', port: 8000 } }, 'upstreams[0].dns.name'],
    [{ dns: { name: 'a.test' } }, 'upstreams[0].dns.port` is required'],
    [{ dns: { name: 'a.test', port: 8000, servers: ['not an address'] } }, 'upstreams[0].dns.servers'],
    [{ dns: { name: 'a.test', port: 8000, intervalMs: 1 } }, 'upstreams[0].dns.intervalMs'],
    [{ dns: { name: 'a.test', port: 8000, server: ['127.0.0.1'] } }, 'upstreams[0].dns.server` is not an option. Did you mean `servers`?'],
    [{ dns: { name: 'a.test', port: 8000, maxAddresses: 0 } }, 'upstreams[0].dns.maxAddresses` must be an integer from 1 to 65536'],
    [{ dns: { name: 'a.test', port: 8000 }, kvEvents: { endpoint: 'tcp://127.0.0.1:5557' } }, 'upstreams[0].kvEvents'],
  ])('rejects %j', (upstream, message) => {
    const attempt = () => dpRouter({ upstreams: [upstream as never], metrics: false });
    expect(attempt).toThrow(OptionError);
    expect(attempt).toThrow(message);
  });
});
