import { afterEach, describe, expect, it } from '@jest/globals';
import { OptionError, type SessionAffinityOptions } from '../../lib';
import { parseOptions } from '../../lib/options';
import { sessionAffinity } from '../../lib/policies/session-affinity';
import type { Endpoint, PickContext, Policy } from '../../lib/types';
import { echoUpstreams, exchange, startGateway, type TestGateway } from '../helpers';
import { seededRandom } from './fake-endpoints';

function endpoints(count: number, load = 0): Endpoint[] {
  return Array.from({ length: count }, (_, rank) => ({
    key: `http://gpu:8000#${rank}`,
    upstream: 'http://gpu:8000',
    rank,
    inflight: load,
    load,
    healthy: true,
  }));
}

const ctx = (affinityKey: string | undefined): PickContext => ({ path: '/v1/chat/completions', affinityKey, prompt: undefined });
const keys = Array.from({ length: 4000 }, (_, i) => `session-${i}`);

describe('sessionAffinity', () => {
  it('asks the router for the session key', () => {
    expect(sessionAffinity()).toMatchObject({ name: 'session-affinity', usesAffinityKey: true });
  });

  it('sends a key to the same endpoint every time', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    for (const key of keys.slice(0, 100)) {
      const first = policy.pick(candidates, ctx(key));
      for (let i = 0; i < 5; i++) expect(policy.pick(candidates, ctx(key))).toBe(first);
    }
  });

  it('spreads keys about evenly', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    const counts = new Array(8).fill(0);
    for (const key of keys) counts[policy.pick(candidates, ctx(key)).rank]++;
    for (const count of counts) expect(Math.abs(count - 500)).toBeLessThan(100);
  });

  it('removing an endpoint moves only the keys it held', () => {
    const policy = sessionAffinity();
    const all = endpoints(8);
    const before = keys.map((key) => policy.pick(all, ctx(key)).rank);
    const without3 = all.filter((e) => e.rank !== 3);
    const after = keys.map((key) => policy.pick(without3, ctx(key)).rank);
    keys.forEach((_, i) => {
      if (before[i] !== 3) expect(after[i]).toBe(before[i]);
      else expect(after[i]).not.toBe(3);
    });
  });

  it('adding an endpoint moves no session; new sessions fill it first', () => {
    const policy = sessionAffinity();
    const nine = endpoints(9);
    const eight = nine.slice(0, 8);
    const before = keys.map((key) => policy.pick(eight, ctx(key)).rank);
    keys.forEach((key, i) => expect(policy.pick(nine, ctx(key)).rank).toBe(before[i]));
    // 4000 sessions on 8: the new endpoint is below ⌈(4000 + 1) / 9⌉ = 445 until it has 445.
    const fresh = Array.from({ length: 445 }, (_, i) => policy.pick(nine, ctx(`new-${i}`)).rank);
    expect(fresh.every((rank) => rank === 8)).toBe(true);
  });

  it('balances the session count within one, where plain hashing would not', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    const counts = new Array(8).fill(0);
    for (let i = 0; i < 24; i++) counts[policy.pick(candidates, ctx(`conversation-${i}`)).rank]++;
    expect(counts).toEqual(new Array(8).fill(3));
  });

  it('with a larger keyLoadFactor, keeps sessions on their first choice more often', () => {
    const loose = sessionAffinity({ keyLoadFactor: 2 });
    const strict = sessionAffinity();
    const candidates = endpoints(8);
    // First choices: what an unbounded assignment gives, one fresh policy per key.
    const firstChoice = keys.slice(0, 400).map((key) => sessionAffinity({ keyLoadFactor: 1000 }).pick(candidates, ctx(key)).rank);
    const agree = (policy: Policy): number =>
      keys.slice(0, 400).filter((key, i) => policy.pick(candidates, ctx(key)).rank === firstChoice[i]).length;
    expect(agree(loose)).toBeGreaterThan(agree(strict));
    expect(() => sessionAffinity({ keyLoadFactor: 0.9 })).toThrow(/keyLoadFactor/);
  });

  it('remembers at most maxSessions sessions, least recently used out first', () => {
    const policy = sessionAffinity({ maxSessions: 3 });
    const candidates = endpoints(8);
    const home = (key: string) => policy.pick(candidates, ctx(key)).rank;
    const a = home('a');
    home('b');
    home('c');
    expect(home('a')).toBe(a); // touched: 'b' is now the oldest
    home('d'); // forgets 'b', and its count: three sessions stay remembered
    const counts = new Array(8).fill(0);
    for (const key of ['a', 'c', 'd']) counts[home(key)]++;
    expect(counts.reduce((x, y) => x + y)).toBe(3);
    expect(() => sessionAffinity({ maxSessions: 0 })).toThrow(/maxSessions/);
  });

  it('does not depend on endpoint object identity or order, only on keys', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    const copies = candidates.map((e) => ({ ...e })).reverse();
    for (const key of keys.slice(0, 200)) expect(policy.pick(copies, ctx(key)).key).toBe(policy.pick(candidates, ctx(key)).key);
  });

  it('skips an endpoint loaded above ⌈loadFactor × mean⌉ for one request; the session stays', () => {
    const policy = sessionAffinity({ loadFactor: 1.25 });
    const candidates = endpoints(8, 2);
    const key = 'hot-session';
    const home = policy.pick(candidates, ctx(key));
    const loaded = candidates.map((e) => (e === home ? { ...e, load: 9, inflight: 9 } : e));
    // mean = (7 × 2 + 9) / 8 = 2.875; cap = ⌈3.59⌉ = 4 < 9
    const moved = policy.pick(loaded, ctx(key));
    expect(moved.key).not.toBe(home.key);
    expect(policy.pick(loaded, ctx(key)).key).toBe(moved.key); // the same spill-over, by the key's order
    expect(policy.pick(candidates, ctx(key)).key).toBe(home.key);
  });

  it('tolerates one request of slack near idle', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    const key = 'quiet-session';
    const home = policy.pick(candidates, ctx(key));
    const busyHome = candidates.map((e) => (e === home ? { ...e, load: 1, inflight: 1 } : e));
    expect(policy.pick(busyHome, ctx(key)).key).toBe(home.key);
  });

  it('uses the fallback without a key', () => {
    const calls: string[] = [];
    const fallback: Policy = {
      name: 'spy',
      pick(candidates) {
        calls.push('fallback');
        return candidates[candidates.length - 1];
      },
    };
    const policy = sessionAffinity({ fallback });
    const candidates = endpoints(4);
    expect(policy.pick(candidates, ctx(undefined))).toBe(candidates[3]);
    expect(policy.pick(candidates, ctx(''))).toBe(candidates[3]);
    expect(calls).toHaveLength(2);
  });

  it('keeps a session on its endpoint while it is at most loadSlack requests ahead of the least loaded', () => {
    const policy = sessionAffinity();
    const candidates = endpoints(8);
    const key = 'low-load-session';
    const home = policy.pick(candidates, ctx(key));
    const withHome = (load: number) => candidates.map((e) => (e === home ? { ...e, load, inflight: load } : e));
    // Three other requests on it, none elsewhere: mean 0.375, ⌈1.25 × mean⌉ = 1, but nothing
    // queues anywhere, and the session's cache is there.
    expect(policy.pick(withHome(3), ctx(key)).key).toBe(home.key);
    expect(policy.pick(withHome(4), ctx(key)).key).toBe(home.key);
    // A hot session: five ahead of an idle endpoint spills.
    expect(policy.pick(withHome(5), ctx(key)).key).not.toBe(home.key);
    // The slack counts from the least loaded endpoint, not from zero.
    const busy = candidates.map((e) => (e === home ? { ...e, load: 9, inflight: 9 } : { ...e, load: 5, inflight: 5 }));
    expect(policy.pick(busy, ctx(key)).key).toBe(home.key);
    const ratioOnly = sessionAffinity({ loadSlack: 0 });
    const again = ratioOnly.pick(candidates, ctx(key));
    expect(ratioOnly.pick(candidates.map((e) => (e === again ? { ...e, load: 3, inflight: 3 } : e)), ctx(key)).key).not.toBe(again.key);
    expect(() => sessionAffinity({ loadSlack: -1 })).toThrow(/loadSlack/);
  });

  it('rejects a load factor below 1', () => {
    expect(() => sessionAffinity({ loadFactor: 0.5 })).toThrow(TypeError);
    expect(() => sessionAffinity({ loadFactor: Number.NaN })).toThrow(/loadFactor/);
  });

  it("checks its options by the router's `affinity` rules, with the one OptionError", () => {
    expect(() => sessionAffinity({ loadFactor: 0.5 })).toThrow(OptionError);
    expect(() => sessionAffinity({ loadFactor: 0.5 })).toThrow('express-dp-router: `sessionAffinity.loadFactor` must be a number from 1 to 1000, got 0.5. Use e.g. `sessionAffinity.loadFactor: 1.25`.');
    // The same rule, the same problem text, as the router's option.
    expect(() => parseOptions({ upstreams: [{ url: 'http://127.0.0.1:8000' }], affinity: { loadFactor: 0.5 } })).toThrow('`affinity.loadFactor` must be a number from 1 to 1000, got 0.5.');
    expect(() => sessionAffinity({ loadfactor: 2 } as SessionAffinityOptions)).toThrow(/`sessionAffinity\.loadfactor` is not an option\. Did you mean `loadFactor`\?/);
    expect(() => sessionAffinity({ fallback: 'random' as unknown as Policy })).toThrow(/`sessionAffinity\.fallback` must be a policy object/);
  });
});

describe('sessionAffinity through the middleware', () => {
  const echo = echoUpstreams();
  let gateway: TestGateway | undefined;
  afterEach(async () => {
    await gateway?.close();
    gateway = undefined;
  });

  it('keeps ≥ 99% of follow-up turns on the previous rank: 128 sessions × 4 turns on 8 ranks at concurrency 8', async () => {
    const upstream = await echo();
    let answered = 0;
    // Each answer takes a moment, so that the eight clients' requests overlap as real ones do.
    upstream.respond = (_req, res) => {
      const rankHeaders = upstream.seen[upstream.seen.length - 1].rankHeaders;
      setTimeout(() => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ rankHeaders }));
      }, 1 + (answered++ % 4));
    };
    gateway = await startGateway({ upstreams: [{ url: upstream.url, dataParallelSize: 8 }], policy: 'session-affinity' });
    const url = gateway.url;
    const sessions = 128;
    const turns = 4;
    const ranks: string[][] = Array.from({ length: sessions }, () => []);
    // Sessions start in a shuffled order and each next turn queues at a random place (think
    // times differ), so the sessions in flight together are any eight; a session's next turn
    // waits for its previous answer.
    const random = seededRandom(13);
    const ready: number[] = [];
    const enqueue = (session: number) => ready.splice(Math.floor(random() * (ready.length + 1)), 0, session);
    for (let session = 0; session < sessions; session++) enqueue(session);
    const client = async () => {
      for (let session = ready.shift(); session !== undefined; session = ready.shift()) {
        const answer = await exchange(url, {
          path: '/v1/chat/completions',
          headers: { 'x-session-id': `chat-${session}` },
          body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: `turn ${ranks[session].length}` }] }),
        });
        expect(answer.status).toBe(200);
        ranks[session].push(JSON.parse(answer.body).rankHeaders[0]);
        if (ranks[session].length < turns) enqueue(session);
      }
    };
    await Promise.all(Array.from({ length: 8 }, client));
    let followUps = 0;
    let sameRank = 0;
    for (const visited of ranks) {
      for (let turn = 1; turn < turns; turn++) {
        followUps++;
        if (visited[turn] === visited[turn - 1]) sameRank++;
      }
    }
    expect(followUps).toBe(384);
    expect(sameRank / followUps).toBeGreaterThanOrEqual(0.99);
  });
});
