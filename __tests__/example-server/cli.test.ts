import { describe, expect, it } from '@jest/globals';
import { join } from 'node:path';
import pino from 'pino';
import { parseCommandLine, UsageError, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway } from '../../example-server/gateway';
import { admissionFromFlags } from '../../example-server/admission';

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
      mockTiming: {},
    });
  });

  it("reads the embedded mock's timing flags, refusing speeds that do not match --dp-size and --mock-decode-ms beside them", () => {
    expect(parse('--mock-speeds', '1,1,0.5,0.5', '--mock-step-ms', '25', '--mock-cpu-blocks', '4096').mockTiming).toEqual({ speeds: [1, 1, 0.5, 0.5], stepMs: 25, cpuBlocks: 4096 });
    expect(parse('--mock-speeds', '0.5').mockTiming).toEqual({ speeds: [0.5] });
    expect(() => parse('--mock-speeds', '1,1,0.5')).toThrow(/3 speeds for the embedded mock's 4 ranks/);
    expect(() => parse('--mock-speeds', '1,0,1,1')).toThrow(UsageError);
    expect(() => parse('--mock-speeds', '1', '--mock-decode-ms', '5')).toThrow(/give one or the other/);
    expect(() => parse('--upstream', 'http://127.0.0.1:8000', '--mock-cpu-blocks', '10')).toThrow(/--mock-cpu-blocks sets up the embedded mock/);
  });

  it('reads the admission flags and the mock’s --mock-max-num-seqs, refusing a bad header name or Redis URL', () => {
    const settings = parse('--max-inflight-per-rank', '8', '--queue-max=100', '--queue-timeout-ms', '2000', '--tenant-header', 'X-Tenant-Id', '--tokens-per-minute', '50000', '--redis', 'redis://127.0.0.1:6379', '--mock-max-num-seqs', '4');
    expect(settings.admission).toEqual({ maxInflightPerRank: 8, queueMax: 100, queueTimeoutMs: 2000, tenantHeader: 'x-tenant-id', tokensPerMinute: 50_000, redisUrl: 'redis://127.0.0.1:6379' });
    expect(settings.mockMaxNumSeqs).toBe(4);
    expect(() => parse('--tenant-header', 'x tenant')).toThrow(UsageError);
    expect(() => parse('--redis', 'http://127.0.0.1:6379')).toThrow(/redis:\/\//);
  });

  it('takes the Redis URL from DP_ROUTER_REDIS_URL for the token budget, --redis first, and never echoes a password it refuses (item 41.13)', () => {
    const env = { DP_ROUTER_REDIS_URL: 'redis://:secret@10.0.0.9:6379' };
    expect((parseCommandLine(['--tokens-per-minute', '1000'], env) as GatewaySettings).admission).toEqual({ tokensPerMinute: 1000, redisUrl: 'redis://:secret@10.0.0.9:6379' });
    expect((parseCommandLine(['--tokens-per-minute', '1000', '--redis', 'redis://127.0.0.1:6379'], env) as GatewaySettings).admission.redisUrl).toBe('redis://127.0.0.1:6379');
    // Only the token budget uses Redis: the variable alone turns nothing on.
    expect((parseCommandLine([], env) as GatewaySettings).admission).toEqual({});
    const refused = [
      () => parse('--redis', 'http://user:secret@127.0.0.1:6379'),
      () => parse('--redis', 'redis://:se#cret@127.0.0.1:6379'),
      () => parseCommandLine(['--tokens-per-minute', '1000'], { DP_ROUTER_REDIS_URL: 'rediss//:secret@host' }),
      () => parse('--otlp-endpoint', 'ftp://user:secret@127.0.0.1:4318'),
      () => parse('--otlp-endpoint', 'http//user:secret@127.0.0.1:4318'),
    ];
    for (const attempt of refused) {
      expect(attempt).toThrow(UsageError);
      expect(attempt).not.toThrow(/cret/);
    }
    expect(refused[2]).toThrow(/^DP_ROUTER_REDIS_URL must be a redis:\/\/ URL/);
  });

  it('trusts every caller\'s tenant header only with --trust-tenant, which needs --tenant-header', async () => {
    expect(parse('--tenant-header', 'x-tenant-id').admission).toEqual({ tenantHeader: 'x-tenant-id' });
    const flags = parse('--tenant-header', 'x-tenant-id', '--trust-tenant').admission;
    expect(flags).toEqual({ tenantHeader: 'x-tenant-id', trustTenant: true });
    expect((await admissionFromFlags(flags, () => undefined)).options?.tenant).toEqual({ header: 'x-tenant-id', trust: true });
    expect((await admissionFromFlags({ tenantHeader: 'x-tenant-id' }, () => undefined)).options?.tenant).toEqual({ header: 'x-tenant-id' });
    expect(() => parse('--trust-tenant')).toThrow(/--trust-tenant .*--tenant-header NAME/);
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

  it('reads --default-chat-template-kwargs as a JSON object, as vLLM does, and the gateway hands it to prefixAware', async () => {
    expect(parse('--policy', 'prefix-aware', '--tokenizer', TOKENIZER, '--default-chat-template-kwargs', '{"enable_thinking": false}').chatTemplateKwargs).toEqual({ enable_thinking: false });
    expect(() => parse('--default-chat-template-kwargs', "{'enable_thinking': False}")).toThrow(/^--default-chat-template-kwargs must be JSON, e\.g\. '\{"enable_thinking": false\}'/);
    expect(() => parse('--default-chat-template-kwargs', '[1]')).toThrow(/must be a JSON object/);
    // The router checks the keys, naming the option's path.
    const settings = { ...parse('--policy', 'prefix-aware', '--port', '0', '--tokenizer', TOKENIZER, '--default-chat-template-kwargs', '{"tokenize": true}'), upstreams: [{ url: 'http://127.0.0.1:1' }] };
    await expect(startExampleGateway(settings, pino({ level: 'silent' }))).rejects.toThrow(/`prefixAware\.chatTemplateKwargs\.tokenize` is not a template variable/);
  });

  it('48.11: refuses --default-chat-template-kwargs where no prefix-aware policy renders chat requests, and takes --rank-header for the embedded mock too', () => {
    expect(() => parse('--default-chat-template-kwargs', '{"enable_thinking": false}')).toThrow(
      '--default-chat-template-kwargs is read only by --policy prefix-aware (or --pd, --prefill and --decode), and the policy is least-outstanding: add --policy prefix-aware or drop --default-chat-template-kwargs',
    );
    expect(parse('--pd', '--default-chat-template-kwargs', '{"enable_thinking": false}').chatTemplateKwargs).toEqual({ enable_thinking: false });
    expect(parse('--rank-header', 'none')).toMatchObject({ upstreams: [], rankHeader: 'none' });
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
      { url: 'http://10.0.0.5:8000', startRank: 0, dataParallelSize: 7, ranks: [0, 2, 4, 6], rankHeader: 'local' },
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
    // Every rank from the start rank on: no \`ranks\` list, which --discover could not route past.
    const [upstream] = parse('--upstream', 'http://h:8000', '--dp-size', '8', '--start-rank', '8').upstreams;
    expect(upstream).toMatchObject({ startRank: 8, dataParallelSize: 8 });
    expect(upstream.ranks).toBeUndefined();
  });

  // vLLM reads the header as an index from 0 into the engines a server manages, in every mode
  // (vllm/v1/engine/input_processor.py:252-259): by default each upstream starts where its ranks do.
  it('sets up hybrid and external load balancing by default: header values from each server\'s start rank', () => {
    const { upstreams } = parse('--upstream', 'http://node-a:8000@0-3', '--upstream', 'http://node-b:8000@4-7');
    expect(upstreams.map(({ startRank, rankHeader }) => [startRank, rankHeader])).toEqual([
      [0, 'local'],
      [4, 'local'],
    ]);
    const external = parse('--upstream', 'http://h:8000@0', '--upstream', 'http://h:8001@1').upstreams;
    expect(external.map(({ startRank, rankHeader }) => [startRank, rankHeader])).toEqual([
      [0, 'local'],
      [1, 'local'],
    ]);
    expect(parse('--upstream', 'http://node-b:8000@5,7', '--start-rank', '4').upstreams[0].startRank).toBe(4);
    expect(parse('--upstream', 'http://node-b:8000@4-7', '--rank-header', 'global').upstreams[0].rankHeader).toBe('global');
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
    expect(parse('--policy', 'prefix-aware', '--placement-slack', '2.5').placementSlack).toBe(2.5);
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
    expect(() => parseCommandLine(['--peer-redis'], env)).toThrow(/--peer-redis announces on a Redis server: give its URL in DP_ROUTER_REDIS_URL \(or --redis URL\)/);
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
      { url: 'http://a:8000', startRank: 0, dataParallelSize: 4, ranks: [0, 1, 2, 3], rankHeader: 'local', models: ['llama', 'llama-sql-lora'] },
      { dns: { name: 'vllm-pods.default.svc.cluster.local', port: 8000, servers: ['10.96.0.10', '127.0.0.1:5353'] }, name: 'vllm-pods.default.svc.cluster.local', startRank: 0, dataParallelSize: 2, rankHeader: 'local' },
      { dns: { name: 'qwen-pods.default.svc.cluster.local', port: 8001, servers: ['10.96.0.10', '127.0.0.1:5353'] }, name: 'qwen-pods.default.svc.cluster.local', startRank: 0, dataParallelSize: 3, ranks: [0, 2], rankHeader: 'local', models: ['qwen'] },
    ]);
  });

  it('names --upstream-dns upstreams NAME/ADDRESS (NAME:PORT/ADDRESS for a name given with two ports), and merges a NAME:PORT given again', () => {
    // --start-rank 0: b.test's pods are internal-LB servers whose ranks 1 and 3 are routed (48.2).
    const { upstreams } = parse('--upstream-dns', 'a.test:8000@0', '--upstream-dns', 'a.test:8001', '--upstream-dns', 'b.test:8000@1', '--upstream-dns', 'b.test:8000@3', '--model', 'm', '--dp-size', '1', '--start-rank', '0');
    expect(upstreams.map((upstream) => [upstream.name, upstream.ranks, upstream.models])).toEqual([
      ['a.test:8000', [0], undefined],
      ['a.test:8001', undefined, undefined],
      ['b.test', [1, 3], ['m']],
    ]);
  });

  it('reads what follows the last @ as ranks unless it is a host: a mistyped rank list is said to be one', () => {
    expect(() => parse('--upstream', 'http://10.0.0.5:8000@0,2,x')).toThrow('--upstream "http://10.0.0.5:8000@0,2,x": "x" is not a rank: ranks after the @ look like 0,2,4,6 or 4-7');
    expect(() => parse('--upstream', 'http://10.0.0.5:8000@0;2')).toThrow(/"0;2" is not a rank/);
    expect(() => parse('--upstream-dns', 'vllm.test:8000@0,x')).toThrow('--upstream-dns "vllm.test:8000@0,x": "x" is not a rank');
    // A host after user information is credentials, refused without printing them, in the CLI's words.
    const credentials = () => parse('--upstream', 'http://admin:s3cret@vllm.internal:8000@0-3');
    expect(credentials).toThrow(/^--upstream "http:\/\/\*\*\*@vllm\.internal:8000@0-3" carries credentials .*: give --upstream http:\/\/vllm\.internal:8000@0-3 instead \(vLLM's --api-key is checked against each client's own `Authorization: Bearer …`, which the router passes through\)$/);
    expect(credentials).not.toThrow(/s3cret|url:/);
  });

  it('says how to fix a URL in CLI words, naming the flag it came with', () => {
    expect(() => parse('--upstream', 'http://h:8000/v1@0-3')).toThrow(/^--upstream "http:\/\/h:8000\/v1@0-3" ends in \/v1, an OpenAI base URL: .*: give --upstream http:\/\/h:8000@0-3 instead$/);
    expect(() => parse('--upstream', 'http://h:8000/?x=1')).toThrow(/: give --upstream http:\/\/h:8000 instead$/);
    expect(() => parse('--prefill', 'http://p:8000/v1', '--decode', 'http://d:8000')).toThrow(/^--prefill "http:\/\/p:8000\/v1" ends in \/v1.*: give --prefill http:\/\/p:8000 instead$/);
  });

  it.each([
    [['--port', '8080', '--port', '9090'], '--port is given twice ("8080", then "9090"): it takes one value; give it once'],
    [['--policy', 'round-robin', '--policy=random'], '--policy is given twice ("round-robin", then "random")'],
    // Never a password, though the values are shown.
    [['--tokens-per-minute', '9', '--redis', 'redis://:hunter2@h:6379', '--redis', 'redis://u:pw@h:6380'], '--redis is given twice ("redis://***@h:6379", then "redis://***@h:6380")'],
    // --dp-size reads as if it belonged to the --upstream before it, as --model does; it does not.
    [['--upstream', 'http://a:8000', '--dp-size', '4', '--upstream', 'http://b:8000', '--dp-size', '8'], '--dp-size is given twice ("4", then "8"): one value applies to every upstream, not to the one before it; give a server of another size its ranks as URL@RANKS'],
    [['--start-rank', '0', '--start-rank', '4'], '--start-rank is given twice ("0", then "4"): one value applies to every upstream'],
  ])('refuses a single-value flag given twice: %j', (argv, message) => {
    expect(() => parseCommandLine(argv)).toThrow(UsageError);
    expect(() => parseCommandLine(argv)).toThrow(message);
    expect(() => parseCommandLine(argv)).not.toThrow(/hunter2|pw@/);
  });

  it.each([
    [['--placement-slack', '0'], '--placement-slack is read only by --policy prefix-aware (or --pd, --prefill and --decode), and the policy is least-outstanding: add --policy prefix-aware or drop --placement-slack'],
    [['--policy', 'round-robin', '--placement-slack', '2'], 'the policy is round-robin: add --policy prefix-aware or drop --placement-slack'],
    [['--load-feedback-weight', '0.3'], '--load-feedback-weight weighs the engine load --load-feedback-ms polls, and that is off: add --load-feedback-ms N or drop --load-feedback-weight'],
    [['--on-invalid', 'reject'], '--on-invalid says what an invalid trusted hint gets, and hints are untrusted (each is removed unread): add --trust-hints or drop --on-invalid'],
    [['--upstream', 'http://a:8000', '--mock-decode-ms', '50'], '--mock-decode-ms sets up the embedded mock vLLM, which does not start with --upstream: drop --mock-decode-ms'],
    [['--upstream-dns', 'vllm.test:8000', '--mock-port', '30001'], '--mock-port sets up the embedded mock vLLM, which does not start with --upstream-dns: drop --mock-port'],
    [['--upstream', 'http://a:8000@0-3', '--upstream', 'http://b:8000@4-7', '--dp-size', '8'], '--dp-size gives the ranks of each upstream given without @RANKS (and of the embedded mock), and every upstream here gives its own: drop --dp-size'],
  ])('refuses a flag the others leave without effect, saying why: %j', (argv, message) => {
    expect(() => parseCommandLine(argv)).toThrow(UsageError);
    expect(() => parseCommandLine(argv)).toThrow(message);
  });

  it('takes the same flags where they have an effect', () => {
    expect(parse('--pd', '--placement-slack', '0').placementSlack).toBe(0);
    expect(parse('--trust-hints', '--on-invalid', 'reject').onInvalid).toBe('reject');
    expect(parse('--mock-decode-ms', '50', '--mock-port', '0').mockDecodeMs).toBe(50);
    expect(parse('--upstream', 'http://a:8000@0-3', '--upstream', 'http://b:8000', '--dp-size', '8').upstreams.map((upstream) => [upstream.ranks?.length, upstream.dataParallelSize])).toEqual([
      [4, 4],
      [undefined, 8],
    ]);
    expect(parse('--pd', '--dp-size', '2').dpSize).toBe(2);
  });

  it('reads the SLO flags (prefix-aware only) into the slo option', () => {
    expect(parse('--policy', 'prefix-aware', '--slo-ttft-ms', '300', '--slo-tpot-ms', '50', '--trust-slo', '--slo-shed').slo).toEqual({ ttftMs: 300, tpotMs: 50, trust: true, shed: true });
    expect(parse('--policy', 'prefix-aware').slo).toBeUndefined();
    expect(() => parseCommandLine(['--slo-ttft-ms', '300'])).toThrow('--slo-ttft-ms routes on prefix-aware\'s cache and queue estimates, and the policy is least-outstanding: add --policy prefix-aware or drop --slo-ttft-ms');
    expect(() => parseCommandLine(['--policy', 'prefix-aware', '--slo-tpot-ms', '0'])).toThrow(UsageError);
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
    [['--trust-hints', 'false'], /^--trust-hints is a switch and takes no value, got "false" after it: give --trust-hints alone to turn it on, or --trust-hints=false$/],
    [['--trust-hints', 'yes'], /^--trust-hints is a switch and takes no value, got "yes" after it/],
    [['--port', '1', '2'], /^unexpected argument "2": every option starts with --/],
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
