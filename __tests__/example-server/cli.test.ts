import { describe, expect, it } from '@jest/globals';
import { join } from 'node:path';
import { parseCommandLine, UsageError, type GatewaySettings } from '../../example-server/cli';

/** A tokenizer directory that exists: the embedded mock's. */
const TOKENIZER = join(__dirname, '../../example-server/mock-vllm/tokenizer');

const parse = (...argv: string[]) => parseCommandLine(argv) as GatewaySettings;

describe('parseCommandLine', () => {
  it('defaults to the embedded mock on 127.0.0.1:30000', () => {
    expect(parse()).toEqual({
      port: 30000,
      host: '127.0.0.1',
      upstreams: [],
      dpSize: 4,
      policy: 'least-outstanding',
      trustHints: false,
      onInvalid: 'reassign',
      exposeDecision: false,
      mockDecodeMs: 0,
      mockPort: undefined,
      drainTimeoutMs: 30_000,
      healthCheckMs: 0,
      loadFeedbackMs: 0,
      loadFeedbackWeight: 0.5,
      logLevel: 'info',
      otlpEndpoint: undefined,
      tokenizer: undefined,
      admission: {},
      mockMaxNumSeqs: 0,
    });
  });

  it('reads the admission flags and the mock’s --mock-max-num-seqs, refusing a bad header name or Redis URL', () => {
    const settings = parse('--max-inflight-per-rank', '8', '--queue-max=100', '--queue-timeout-ms', '2000', '--tenant-header', 'X-Tenant-Id', '--tokens-per-minute', '50000', '--redis', 'redis://127.0.0.1:6379', '--mock-max-num-seqs', '4');
    expect(settings.admission).toEqual({ maxInflightPerRank: 8, queueMax: 100, queueTimeoutMs: 2000, tenantHeader: 'x-tenant-id', tokensPerMinute: 50_000, redisUrl: 'redis://127.0.0.1:6379' });
    expect(settings.mockMaxNumSeqs).toBe(4);
    expect(() => parse('--tenant-header', 'x tenant')).toThrow(UsageError);
    expect(() => parse('--redis', 'http://127.0.0.1:6379')).toThrow(/redis:\/\//);
  });

  it('gives --kv-events to the --upstream before it, with --tokenizer', () => {
    const { upstreams, tokenizer } = parse(
      '--policy', 'prefix-aware',
      '--upstream', 'http://a:8000@0-3',
      '--kv-events', 'tcp://a:5557,tcp://a:5558',
      '--upstream', 'http://b:8000@4-7',
      '--upstream', 'http://c:8000@8',
      '--kv-events', 'tcp://c:6000',
      '--tokenizer', TOKENIZER,
    );
    expect(upstreams.map((upstream) => upstream.kvEvents)).toEqual([
      { endpoint: 'tcp://a:5557', replayEndpoint: 'tcp://a:5558' },
      undefined,
      { endpoint: 'tcp://c:6000' },
    ]);
    expect(tokenizer).toBe(TOKENIZER);
  });

  it('takes --tokenizer for prefix-aware and for disaggregation, whose prefill policy is prefix-aware', () => {
    expect(parse('--policy', 'prefix-aware', '--tokenizer', TOKENIZER).tokenizer).toBe(TOKENIZER);
    expect(parse('--pd', '--tokenizer', TOKENIZER).tokenizer).toBe(TOKENIZER);
    expect(parse('--prefill', 'http://p:8000', '--decode', 'http://d:8000', '--tokenizer', TOKENIZER).tokenizer).toBe(TOKENIZER);
  });

  it('reads the log level from LOG_LEVEL, and --log-level over it, and the OTLP endpoint', () => {
    expect((parseCommandLine([], { LOG_LEVEL: 'debug' }) as GatewaySettings).logLevel).toBe('debug');
    expect((parseCommandLine(['--log-level', 'warn'], { LOG_LEVEL: 'debug' }) as GatewaySettings).logLevel).toBe('warn');
    expect((parseCommandLine(['--otlp-endpoint', 'http://127.0.0.1:4318']) as GatewaySettings).otlpEndpoint).toBe('http://127.0.0.1:4318/');
  });

  it('reads HOST from the environment, and --host over it', () => {
    expect((parseCommandLine([], { HOST: '0.0.0.0' }) as GatewaySettings).host).toBe('0.0.0.0');
    expect((parseCommandLine(['--host', '::1'], { HOST: '0.0.0.0' }) as GatewaySettings).host).toBe('::1');
    // listen(port, '') would bind every interface.
    expect((parseCommandLine([], { HOST: '', PORT: '', LOG_LEVEL: '' }) as GatewaySettings)).toMatchObject({ host: '127.0.0.1', port: 30000, logLevel: 'info' });
  });

  it('reads PORT from the environment, and --port over it', () => {
    expect((parseCommandLine([], { PORT: '8080' }) as GatewaySettings).port).toBe(8080);
    expect((parseCommandLine(['--port', '9000'], { PORT: '8080' }) as GatewaySettings).port).toBe(9000);
    expect(parse('--port=0').port).toBe(0);
  });

  it('routes the seed scenario: ranks 0,2,4,6 of an 8-rank server', () => {
    expect(parse('--upstream', 'http://10.0.0.5:8000@0,2,4,6').upstreams).toEqual([
      { url: 'http://10.0.0.5:8000', startRank: 0, dataParallelSize: 7, ranks: [0, 2, 4, 6], rankHeader: 'global' },
    ]);
  });

  it("merges vllm-router's repeated URL@RANK form into one upstream", () => {
    const { upstreams } = parse('--upstream', 'http://h:8000@2', '--upstream', 'http://h:8000@0', '--upstream', 'http://g:8000@1-3');
    expect(upstreams.map((upstream) => [upstream.url, upstream.ranks])).toEqual([
      ['http://h:8000', [0, 2]],
      ['http://g:8000', [1, 2, 3]],
    ]);
  });

  it('gives upstreams without @RANKS --dp-size ranks from --start-rank', () => {
    expect(parse('--upstream', 'http://h:8000', '--dp-size', '8', '--start-rank', '8').upstreams[0]).toMatchObject({
      startRank: 8,
      ranks: [8, 9, 10, 11, 12, 13, 14, 15],
    });
  });

  it('sets up hybrid load balancing: local header values from the node start rank', () => {
    const { upstreams } = parse('--upstream', 'http://node-a:8000@0-3', '--upstream', 'http://node-b:8000@4-7', '--rank-header', 'local');
    expect(upstreams.map(({ startRank, rankHeader }) => [startRank, rankHeader])).toEqual([
      [0, 'local'],
      [4, 'local'],
    ]);
    expect(parse('--upstream', 'http://node-b:8000@5,7', '--start-rank', '4', '--rank-header', 'local').upstreams[0].startRank).toBe(4);
  });

  it('reads the routing flags', () => {
    expect(parse('--policy', 'round-robin', '--trust-hints', '--on-invalid', 'reject', '--expose-decision', '--host', '0.0.0.0')).toMatchObject({
      policy: 'round-robin',
      trustHints: true,
      onInvalid: 'reject',
      exposeDecision: true,
      host: '0.0.0.0',
    });
    expect(parse('--health-check-ms', '2000').healthCheckMs).toBe(2000);
    expect(parse('--mock-port', '8000').mockPort).toBe(8000);
    expect(parse('--mock-port=0').mockPort).toBe(0);
    expect(parse('--load-feedback-ms', '500', '--load-feedback-weight', '0.25')).toMatchObject({ loadFeedbackMs: 500, loadFeedbackWeight: 0.25 });
    expect(parse('--upstream', 'http://h:8000', '--discover').upstreams[0]).toMatchObject({ discover: true });
  });

  it('reads the peers from --peer-listen and --peer, and their secret from DP_ROUTER_PEER_SECRET only', () => {
    const env = { DP_ROUTER_PEER_SECRET: 'a secret of the replicas' };
    const argv = ['--policy', 'prefix-aware', '--placement-slack', '0', '--peer-listen', '0.0.0.0:7946', '--peer', '10.0.0.5:7946', '--peer', '10.0.0.6:7946'];
    expect(parseCommandLine(argv, env)).toMatchObject({
      placementSlack: 0,
      peers: { listen: '0.0.0.0:7946', addresses: ['10.0.0.5:7946', '10.0.0.6:7946'], secret: 'a secret of the replicas' },
    });
    expect(parse()).toMatchObject({ placementSlack: undefined, peers: undefined });
    expect(parse('--placement-slack', '2.5').placementSlack).toBe(2.5);
    expect(() => parseCommandLine(argv, {})).toThrow(/--peer-listen needs the replicas' shared secret in DP_ROUTER_PEER_SECRET/);
    expect(() => parseCommandLine(['--peer-listen', '0.0.0.0:7946'], env)).toThrow(/--peer-listen needs the replicas to announce to/);
    expect(() => parseCommandLine(['--peer', '10.0.0.5:7946'], env)).toThrow(/--peer and --peer-dns name the other replicas for --peer-listen/);
    expect(parseCommandLine(['--peer-listen', '0.0.0.0:7946', '--peer-dns', 'gateway-peers.default.svc.cluster.local:7946'], env)).toMatchObject({
      peers: { listen: '0.0.0.0:7946', addresses: [], dns: { name: 'gateway-peers.default.svc.cluster.local', port: 7946 } },
    });
    expect(() => parseCommandLine(['--peer-listen', '0.0.0.0:7946', '--peer-dns', 'gateway-peers'], env)).toThrow(/--peer-dns must be NAME:PORT/);
    expect(() => parse('--placement-slack', '1e3')).toThrow(/--placement-slack must be a number from 0 to 1000000/);
  });

  it('reads --peer-redis: the peers on the --redis server, with the same secret, and no UDP flags beside it', () => {
    const env = { DP_ROUTER_PEER_SECRET: 'a secret of the replicas' };
    const settings = parseCommandLine(['--redis', 'redis://127.0.0.1:6379', '--peer-redis'], env);
    expect(settings).toMatchObject({ peers: { redis: true, addresses: [], secret: 'a secret of the replicas' }, admission: { redisUrl: 'redis://127.0.0.1:6379' } });
    expect(() => parseCommandLine(['--peer-redis'], env)).toThrow(/--peer-redis announces on the --redis server: give --redis URL too/);
    expect(() => parseCommandLine(['--redis', 'redis://127.0.0.1:6379', '--peer-redis'], {})).toThrow(/--peer-redis needs the replicas' shared secret in DP_ROUTER_PEER_SECRET/);
    expect(() => parseCommandLine(['--redis', 'redis://127.0.0.1:6379', '--peer-redis', '--peer-listen', '0.0.0.0:7946', '--peer', '10.0.0.5:7946'], env)).toThrow(/drop --peer-listen/);
  });

  it('reads a switch alone, or with exactly =true or =false', () => {
    expect(parse('--trust-hints=false', '--expose-decision=false')).toMatchObject({ trustHints: false, exposeDecision: false });
    expect(parse('--trust-hints=true', '--expose-decision=true')).toMatchObject({ trustHints: true, exposeDecision: true });
    expect(parse('--trust-hints', '--trust-hints=false').trustHints).toBe(false);
    expect(parse('--upstream', 'http://h:8000', '--discover=false').upstreams[0]).not.toHaveProperty('discover');
    expect(parse('--upstream', 'http://h:8000', '--discover=true').upstreams[0]).toMatchObject({ discover: true });
    expect(parse('--host=0.0.0.0', '--policy=round-robin')).toMatchObject({ host: '0.0.0.0', policy: 'round-robin' });
  });

  it('finds upstreams by DNS, asks the --dns-server given, and gives --model to the upstream before it', () => {
    const { upstreams } = parse(
      '--upstream', 'http://a:8000@0-3',
      '--model', 'llama',
      '--model', 'llama-sql-lora',
      '--upstream-dns', 'vllm-pods.default.svc.cluster.local:8000',
      '--upstream-dns', 'qwen-pods.default.svc.cluster.local:8001@0,2',
      '--model', 'qwen',
      '--dns-server', '10.96.0.10',
      '--dns-server', '127.0.0.1:5353',
      '--dp-size', '2',
    );
    expect(upstreams).toEqual([
      { url: 'http://a:8000', startRank: 0, dataParallelSize: 4, ranks: [0, 1, 2, 3], rankHeader: 'global', models: ['llama', 'llama-sql-lora'] },
      { dns: { name: 'vllm-pods.default.svc.cluster.local', port: 8000, servers: ['10.96.0.10', '127.0.0.1:5353'] }, startRank: 0, dataParallelSize: 2, ranks: [0, 1], rankHeader: 'global' },
      { dns: { name: 'qwen-pods.default.svc.cluster.local', port: 8001, servers: ['10.96.0.10', '127.0.0.1:5353'] }, startRank: 0, dataParallelSize: 3, ranks: [0, 2], rankHeader: 'global', models: ['qwen'] },
    ]);
  });

  it('answers help', () => {
    expect(parseCommandLine(['--help'])).toBe('help');
    expect(parseCommandLine(['-h'])).toBe('help');
  });

  it.each([
    [['--bogus'], /unknown option "--bogus"/],
    [['--port'], /--port needs a value/],
    [['--trust-hints=0'], /--trust-hints is a switch: give it alone, or as --trust-hints=true or --trust-hints=false, got "--trust-hints=0"/],
    [['--trust-hints=no'], /--trust-hints is a switch/],
    [['--trust-hints='], /--trust-hints is a switch/],
    [['--expose-decision=0'], /--expose-decision is a switch/],
    [['--discover=off'], /--discover is a switch/],
    [['--help=1'], /--help is a switch/],
    [['--trust-hints', 'false'], /unknown option "false"/],
    [['--host='], /--host needs a value/],
    [['--tokenizer', ''], /--tokenizer needs a value/],
    [['--policy', 'prefix-aware', '--tokenizer', '/nonexistent/model'], /^--tokenizer "\/nonexistent\/model": no such file or directory$/],
    [['--tokenizer', TOKENIZER], /^--tokenizer is read only by --policy prefix-aware \(or --pd, --prefill and --decode\), and the policy is least-outstanding: add --policy prefix-aware or drop --tokenizer$/],
    [['--policy', 'round-robin', '--upstream', 'http://a:8000', '--kv-events', 'tcp://a:5557', '--tokenizer', TOKENIZER], /--tokenizer is read only by --policy prefix-aware/],
    [['--upstream=', '--port', '1'], /--upstream needs a value/],
    [['--toString'], /unknown option "--toString"/],
    [['--constructor=1'], /unknown option "--constructor=1"/],
    [['--port', 'eighty'], /--port must be an integer/],
    [['--port', '70000'], /--port must be an integer from 0 to 65535/],
    [['--policy', 'fastest'], /--policy must be one of least-outstanding/],
    [['--on-invalid', 'drop'], /--on-invalid must be one of reassign, reject/],
    [['--upstream', 'ftp://h'], /is not an http\(s\) URL/],
    [['--upstream', 'http://h:8000@7-4'], /runs backwards/],
    [['--upstream', 'http://h:8000@0', '--start-rank', '2'], /below --start-rank 2/],
    [['--load-feedback-weight', '1.5'], /--load-feedback-weight must be a number from 0 to 1/],
    [['--rank-header', 'relative'], /--rank-header must be one of global, local, none/],
    [['--log-level', 'verbose'], /--log-level must be one of fatal, error, warn, info, debug, trace, silent/],
    [['--otlp-endpoint', 'grpc://collector:4317'], /--otlp-endpoint must be an http\(s\) URL/],
    [['--otlp-endpoint', 'collector'], /--otlp-endpoint must be an http\(s\) URL/],
    [['--kv-events', 'tcp://a:5557', '--tokenizer', '/t'], /--kv-events names the KV events of the --upstream before it/],
    [['--model', 'llama'], /--model names a model of the --upstream or --upstream-dns before it/],
    [['--upstream-dns', 'vllm-pods'], /--upstream-dns "vllm-pods" is not NAME:PORT\[@RANKS\]/],
    [['--upstream-dns', 'vllm:99999'], /is not NAME:PORT/],
    [['--upstream-dns', 'vllm:8000', '--dns-server', 'kube-dns'], /--dns-server must be an IP address with an optional port/],
    [['--dns-server', '10.96.0.10'], /--dns-server is the server --upstream-dns asks/],
    [['--upstream', 'http://a:8000', '--kv-events', 'tcp://a:5557'], /--kv-events needs --tokenizer PATH/],
    [['--upstream', 'http://a:8000', '--kv-events', 'tcp://*:5557', '--tokenizer', '/t'], /--kv-events "tcp:\/\/\*:5557": .*connect to its address/],
    [['--upstream', 'http://a:8000', '--kv-events', 'tcp://a:1,tcp://a:2,tcp://a:3', '--tokenizer', '/t'], /at most two endpoints/],
  ])('rejects %j with a one-line reason', (argv, message) => {
    expect(() => parseCommandLine(argv)).toThrow(UsageError);
    expect(() => parseCommandLine(argv)).toThrow(message);
  });
});
