import { describe, expect, it } from '@jest/globals';
import { parseCommandLine, UsageError, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway } from '../../example-server/gateway';
import { closedAfterEach, exchange, metricValue } from '../helpers';

const parse = (...argv: string[]) => parseCommandLine(argv) as GatewaySettings;
const started = closedAfterEach();

describe('the disaggregation flags', () => {
  it('give --prefill and --decode servers their roles, and --bootstrap-port to the --prefill before it', () => {
    const settings = parse('--prefill', 'http://p1:8000@0-1', '--bootstrap-port', '9000', '--prefill', 'http://p2:8000', '--decode', 'http://d:8000@4-7', '--pd-connector', 'mooncake');
    expect(settings.disaggregation).toEqual({ connector: 'mooncake' });
    // Without @RANKS, every rank from the start rank on: no `ranks` list (--discover may learn them).
    expect(settings.upstreams.map(({ url, role, bootstrapPort, startRank, dataParallelSize, ranks }) => ({ url, role, bootstrapPort, startRank, dataParallelSize, ranks }))).toEqual([
      { url: 'http://p1:8000', role: 'prefill', bootstrapPort: 9000, startRank: 0, dataParallelSize: 2, ranks: [0, 1] },
      { url: 'http://p2:8000', role: 'prefill', bootstrapPort: undefined, startRank: 0, dataParallelSize: 4, ranks: undefined },
      { url: 'http://d:8000', role: 'decode', bootstrapPort: undefined, startRank: 4, dataParallelSize: 4, ranks: [4, 5, 6, 7] },
    ]);
    expect(parse('--pd').disaggregation).toEqual({ connector: 'nixl' });
    expect(parse().disaggregation).toBeUndefined();
  });

  it.each([
    [['--prefill', 'http://p:8000'], /go together/],
    [['--bootstrap-port', '9000'], /the --prefill before it/],
    [['--prefill', 'http://p:8000', '--bootstrap-port', '9000', '--decode', 'http://d:8000'], /mooncake/],
    [['--pd', '--upstream', 'http://u:8000'], /embedded mocks/],
    [['--pd-connector', 'nixl'], /needs --pd/],
    [['--pd-connector', 'p2p'], /nixl, mooncake/],
  ])('refuses %j', (argv, message) => {
    expect(() => parseCommandLine(argv)).toThrow(UsageError);
    expect(() => parseCommandLine(argv)).toThrow(message);
  });
});

describe('npm start -- --pd', () => {
  it.each(['nixl', 'mooncake'])('serves a disaggregated request end to end on the embedded mocks (%s)', async (connector) => {
    const gateway = await startExampleGateway({ ...parse('--pd', '--pd-connector', connector, '--expose-decision', '--dp-size', '2'), port: 0 });
    started.push(gateway);
    expect(gateway.summary).toContain(`prefill/decode disaggregated (${connector}`);
    const answer = await exchange(gateway.url, { path: '/v1/chat/completions', body: '{"model":"mock-model","messages":[{"role":"user","content":"hello"}],"max_tokens":3}' });
    expect(answer.status).toBe(200);
    expect(answer.headers['x-dp-router-decision']).toMatch(/^upstream=mock-decode; rank=\d; source=assigned; prefill=mock-prefill@\d$/);
    expect(gateway.prefillMock!.stats().requests.at(-1)!.leg).toBe('prefill');
    expect(gateway.mock!.stats().requests.at(-1)!.leg).toBe('decode');
    expect(await metricValue(gateway.router.registry, 'dp_router_disaggregated_requests_total', { outcome: 'disaggregated' })).toBe(1);
  });
});
