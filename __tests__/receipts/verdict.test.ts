import { describe, expect, it } from '@jest/globals';
import { UpstreamVerdicts, type KvOutcome, type VerdictSettings } from '../../lib/receipts/verdict';
import fc from 'fast-check';

const SETTINGS: VerdictSettings = { window: 32, minReceipts: 10, elsewhereShare: 0.3, missShare: 0.5, probeEvery: 10 };

describe('UpstreamVerdicts', () => {
  it('takes the rank header as not honoured once a window of enough receipts is elsewhere past the share, with the breakdown', () => {
    const verdicts = new UpstreamVerdicts(SETTINGS);
    const outcomes: Array<[KvOutcome, number]> = [];
    for (let i = 0; i < 9; i++) outcomes.push([i % 3 === 0 ? 'elsewhere' : 'confirmed', i % 4]);
    for (const [outcome, rank] of outcomes) expect(verdicts.kv(outcome, 0, rank, 'chat')).toBeUndefined();
    // Three of nine: under the fewest receipts a verdict takes; the tenth, elsewhere, makes 4 of 10.
    const transition = verdicts.kv('elsewhere', 0, 1, 'completions');
    expect(transition).toEqual({ kind: 'unhonoured', breakdown: expect.objectContaining({ elsewhere: 4, total: 10 }), sources: 1 });
    expect(verdicts.honoured).toBe(false);
    expect(verdicts.exact).toBe(false);
    expect(verdicts.epoch).toBe(1);
  });

  it('lets cached and unseen receipts judge nothing: after a lost batch most blocks go unseen, and nothing is wrong with the upstream', () => {
    const verdicts = new UpstreamVerdicts(SETTINGS);
    for (let i = 0; i < 100; i++) expect(verdicts.kv(i % 2 === 0 ? 'cached' : 'unseen', 0, 0, 'chat')).toBeUndefined();
    expect(verdicts.honoured && verdicts.trusted).toBe(true);
  });

  it('raises no false alarm over 100,000 healthy receipts with 1 % unseen and a rare elsewhere', () => {
    const verdicts = new UpstreamVerdicts(SETTINGS);
    // 200,000 uniform draws in [0, 1), the same every run (noBias: fast-check's arbitraries
    // otherwise favour small values, which would be 1 % lost events no longer).
    const draws = fc.sample(fc.noBias(fc.integer({ min: 0, max: 0xffffffff })), { seed: 7, numRuns: 200_000 }).map((n) => n / 2 ** 32);
    const changes = [];
    for (let i = 0; i < 100_000; i++) {
      const draw = draws[2 * i];
      // 1 % lost events; one in a thousand a request sharing the prefix stored it elsewhere first.
      const outcome: KvOutcome = draw < 0.01 ? 'unseen' : draw < 0.011 ? 'elsewhere' : draw < 0.5 ? 'cached' : 'confirmed';
      const change = verdicts.kv(outcome, 0, i % 8, 'chat') ?? verdicts.usage(0, draws[2 * i + 1] < 0.01, false);
      if (change !== undefined) changes.push(change);
    }
    expect(changes).toEqual([]);
  });

  it('probes one request in probeEvery while a verdict stands, and recovers on the probes alone', () => {
    const verdicts = new UpstreamVerdicts(SETTINGS);
    for (let i = 0; i < 10; i++) verdicts.kv('elsewhere', 0, 0, 'chat');
    expect(verdicts.honoured).toBe(false);
    const probes: number[] = [];
    for (let request = 1; request <= 30; request++) {
      // The pick comes first (a probe when due), then the request counts as routed.
      if (verdicts.exact && verdicts.probing()) probes.push(request);
      verdicts.routed();
    }
    expect(probes).toEqual([11, 21]);
    // A receipt of a request routed before the verdict judges nothing.
    expect(verdicts.kv('elsewhere', 0, 0, 'chat')).toBeUndefined();
    for (let i = 0; i < 9; i++) expect(verdicts.kv('confirmed', 1, 0, 'chat')).toBeUndefined();
    expect(verdicts.kv('confirmed', 1, 0, 'chat')).toEqual({ kind: 'honoured' });
    expect(verdicts.exact).toBe(true);
  });

  it.each([
    ['misses', (verdicts: UpstreamVerdicts) => verdicts.usage(0, true, false)],
    ['tokens', (verdicts: UpstreamVerdicts) => verdicts.usage(0, undefined, true)],
  ] as const)('stops trusting the index on %s past the share', (cause, bad) => {
    const verdicts = new UpstreamVerdicts(SETTINGS);
    for (let i = 0; i < 5; i++) expect(verdicts.usage(0, false, false) ?? verdicts.kv('confirmed', 0, 0, 'chat')).toBeUndefined();
    let change;
    for (let i = 0; i < 10 && change === undefined; i++) change = bad(verdicts);
    expect(change).toMatchObject({ kind: 'untrusted', cause });
    expect(verdicts.trusted).toBe(false);
    expect(verdicts.honoured).toBe(true);
  });

  describe('with minSources 3', () => {
    const THREE = { ...SETTINGS, minSources: 3 };

    it.each([
      ['elsewhere', (verdicts: UpstreamVerdicts, source: string) => verdicts.kv('elsewhere', 0, 0, 'chat', source), 'unhonoured'],
      ['misses', (verdicts: UpstreamVerdicts, source: string) => verdicts.usage(0, true, false, source), 'untrusted'],
      ['tokens', (verdicts: UpstreamVerdicts, source: string) => verdicts.usage(0, undefined, true, source), 'untrusted'],
    ] as const)('one source\'s %s receipts, however many, are refused once and take nothing; three sources take the verdict', (cause, bad, taken) => {
      const alone = new UpstreamVerdicts(THREE);
      const changes = [];
      for (let i = 0; i < 200; i++) {
        const change = bad(alone, 'key:one');
        if (change !== undefined) changes.push(change);
      }
      expect(changes).toEqual([{ kind: 'refused', cause, bad: 32, total: 32, sources: 1 }].map((refusal, at) => (at === 0 ? { ...refusal, bad: 10, total: 10 } : refusal)));
      expect(alone.honoured && alone.trusted).toBe(true);
      // Two sources, one of them heavy: still refused (each source counts at most its part).
      const two = new UpstreamVerdicts(THREE);
      for (let i = 0; i < 40; i++) bad(two, i % 8 === 0 ? 'key:two' : 'key:one');
      expect(two.honoured && two.trusted).toBe(true);
      const three = new UpstreamVerdicts(THREE);
      let change;
      for (let i = 0; i < 40 && (change === undefined || change.kind === 'refused'); i++) change = bad(three, `key:${i % 3}`);
      expect(change).toMatchObject({ kind: taken, sources: 3 });
    });
  });
});
