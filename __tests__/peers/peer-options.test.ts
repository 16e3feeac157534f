import { describe, expect, it } from '@jest/globals';
import { OptionError } from '../../lib';
import { parseOptions } from '../../lib/options';

const url = 'http://127.0.0.1:8000';
const peers = { listen: '0.0.0.0:7946', addresses: ['10.0.0.5:7946', '[fd00::6]:7946'], secret: 'x'.repeat(32) };
const parse = (value: unknown) => parseOptions({ upstreams: [{ url }], peers: value as never }, 'dpRouter');

describe('peers options', () => {
  it('are off by default and resolve their defaults once', () => {
    expect(parse(undefined).peers).toBeUndefined();
    expect(parse(false).peers).toBeUndefined();
    expect(parse(peers).peers).toEqual({
      listen: { host: '0.0.0.0', port: 7946 },
      addresses: [{ host: '10.0.0.5', port: 7946 }, { host: 'fd00::6', port: 7946 }],
      secret: Buffer.from(peers.secret),
      heartbeatMs: 1000,
      ttlMs: 3000,
      announceMs: 50,
    });
    expect(parse({ ...peers, heartbeatMs: 2000 }).peers?.ttlMs).toBe(6000);
    expect(parse({ listen: peers.listen, secret: peers.secret, dns: { name: 'gateway-peers.default.svc.cluster.local', port: 7946 } }).peers).toMatchObject({
      addresses: [],
      dns: { name: 'gateway-peers.default.svc.cluster.local', port: 7946, intervalMs: 10_000, servers: undefined },
    });
  });

  it.each([
    ['a string', 'on', 'peers', /must be an object/],
    ['a misspelt key', { ...peers, adresses: [] }, 'peers.adresses', /is not an option\. Did you mean `addresses`\?/],
    ['a host name', { ...peers, listen: 'gateway-0:7946' }, 'peers.listen', /with an IP address/],
    ['no port', { ...peers, listen: '10.0.0.5' }, 'peers.listen', /'host:port'/],
    ['a port past 65535', { ...peers, listen: '10.0.0.5:70000' }, 'peers.listen', /port from 0 to 65535/],
    ['an IPv6 address without brackets', { ...peers, listen: 'fd00::6:7946' }, 'peers.listen', /'host:port'/],
    ['no addresses', { ...peers, addresses: [] }, 'peers.addresses', /array of 1 to 64/],
    ['neither addresses nor dns', { listen: peers.listen, secret: peers.secret }, 'peers.addresses', /is required without `dns`/],
    ['a DNS name with a space', { ...peers, dns: { name: 'gateway peers', port: 7946 } }, 'peers.dns.name', /must be a DNS name/],
    ['a DNS entry without a port', { ...peers, dns: { name: 'gateway-peers' } }, 'peers.dns.port', /is required/],
    ['a wrong address', { ...peers, addresses: ['10.0.0.5:7946', 7946] }, 'peers.addresses[1]', /'host:port' string/],
    ['no secret', { listen: peers.listen, addresses: peers.addresses }, 'peers.secret', /at least 16 characters, got undefined/],
    ['a short secret', { ...peers, secret: 'hunter2' }, 'peers.secret', /at least 16 characters, got 7 characters/],
    ['a heartbeat of 0', { ...peers, heartbeatMs: 0 }, 'peers.heartbeatMs', /integer from 10/],
    ['a ttl within a heartbeat', { ...peers, heartbeatMs: 1000, ttlMs: 1000 }, 'peers.ttlMs', /longer than heartbeatMs/],
  ])('refuse %s, naming the option and the fix', (_label, value, path, message) => {
    let error: unknown;
    try {
      parse(value);
    } catch (thrown) {
      error = thrown;
    }
    expect(error).toBeInstanceOf(OptionError);
    expect((error as OptionError).path).toBe(path);
    expect((error as OptionError).message).toMatch(message);
    expect((error as OptionError).fix.length).toBeGreaterThan(10);
  });

  it('never print the secret in an error', () => {
    expect(() => parse({ ...peers, secret: 'short-secret' })).toThrow(/got 12 characters/);
    expect(() => parse({ ...peers, secret: 'short-secret' })).not.toThrow(/short-secret/);
  });

  it('are an option of dpRouter() alone: dpRank() leaves the proxying, and the in-flight counts, to the caller', () => {
    expect(() => parseOptions({ upstreams: [{ url }], peers } as never, 'dpRank')).toThrow(/`peers` is an option of dpRouter\(\)/);
  });
});
