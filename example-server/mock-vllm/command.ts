/**
 * `npx tsx example-server/mock-vllm.ts [options]` (or `npm run mock -- [options]`): the mock
 * vLLM on its own, for library users who want an upstream to point `dpRouter()` at without a GPU.
 */
import { listenProblem } from '../listen-problem';
import { startMockVllm } from '../mock-vllm';
import { parseSpeeds, timedMockOptions, type MockTimingFlags } from './timing-flags';
import type { MockVllmOptions } from './types';

export const MOCK_USAGE = `Usage: npx tsx example-server/mock-vllm.ts [options]

A mock vLLM OpenAI-compatible server with data parallelism (vllm serve … --data-parallel-size N):
/v1/chat/completions, /v1/completions (SSE too), /v1/models, /tokenize, /health, /metrics, and
/v1/embeddings, /v1/responses, /pooling, /score, /rerank, /classify, which vLLM balances itself.

X-data-parallel-rank is what vLLM reads it as: an index from 0 into the engines this server
manages; out of that range it answers 400 "data_parallel_rank N is out of range [0, M)." (a
stream: 200, then that error event).

Options:
  --port N              port (0 = any free one)                          [8000]
  --host H              bind address                                     [127.0.0.1]
  --data-parallel-size N, --dp-size N
                        the deployment's data-parallel size              [4]
  --data-parallel-size-local L, --dp-size-local L
                        engines on this node; with a start rank (or
                        --data-parallel-hybrid-lb) a hybrid-LB node      [N]
  --data-parallel-start-rank S, --start-rank S
                        this node's first global rank                    [0]
  --data-parallel-hybrid-lb
                        hybrid load balancing: this server manages its node's engines only
  --data-parallel-rank R
                        external load balancing: this server runs global rank R alone
  --data-parallel-external-lb
                        external load balancing (with --data-parallel-rank)
  --model NAME          served model name                                [mock-model]
  --decode-ms N         delay per generated token                        [0]
  --speeds S[,S…]       time every rank as vLLM's scheduler does, in steps (decode slows as
                        the batch grows, cache hits skip prefill, one chunk per token), each
                        rank at this relative speed: 1,1,0.5,0.5 (one value: every rank)  [off]
  --step-ms MS          the timed steps' fixed cost at speed 1 (turns timing on)       [10]
  --cpu-blocks N        a CPU tier per rank of N blocks, written through as vLLM's
                        offloading connector does, its events of medium CPU published
                        (needs --kv-events-port)                          [off]
  --kv-events-port N    publish KV-cache events as vLLM's --kv-events-config does: rank r
                        on tcp://HOST:N+r, its replay socket on N+1000+r [off]
  -h, --help            print this help

A hybrid node serving global ranks 4-7 of 8 (it reads the header 0-3):
  --data-parallel-size 8 --data-parallel-size-local 4 --data-parallel-start-rank 4`;

/** The data-parallel flags as given, before they are resolved into the engines this server manages. */
interface DataParallelFlags {
  size?: number;
  sizeLocal?: number;
  startRank?: number;
  rank?: number;
  hybridLb: boolean;
  externalLb: boolean;
}

/** Reads the mock's command line; `'help'` when help was asked for. Throws an `Error` with a one-line reason. */
export function parseMockCommandLine(argv: readonly string[]): MockVllmOptions | 'help' {
  const options: MockVllmOptions = { port: 8000 };
  const dp: DataParallelFlags = { hybridLb: false, externalLb: false };
  const timing: MockTimingFlags = {};
  const integer = (flag: string, raw: string | undefined, min: number, max: number): number => {
    if (raw === undefined || !/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
      throw new Error(`${flag} must be an integer from ${min} to ${max}, got ${JSON.stringify(raw ?? '')}`);
    }
    return Number(raw);
  };
  for (let index = 0; index < argv.length; index++) {
    const arg = argv[index];
    if (arg === '-h' || arg === '--help') return 'help';
    const at = arg.indexOf('=');
    const flag = arg.startsWith('--') && at > 0 ? arg.slice(0, at) : arg;
    const value = () => {
      const raw = arg.startsWith('--') && at > 0 ? arg.slice(at + 1) : argv[++index];
      if (raw === undefined || raw === '') throw new Error(`${flag} needs a value (see --help)`);
      return raw;
    };
    const on = () => {
      if (at > 0 && arg.slice(at + 1) !== 'true') throw new Error(`${flag} is a switch: give it alone, got ${JSON.stringify(arg)}`);
      return true;
    };
    switch (flag) {
      case '--port':
        options.port = integer(flag, value(), 0, 65535);
        break;
      case '--host':
        options.host = value();
        break;
      case '--dp-size':
      case '--data-parallel-size':
        dp.size = integer(flag, value(), 1, 1024);
        break;
      case '--dp-size-local':
      case '--data-parallel-size-local':
        dp.sizeLocal = integer(flag, value(), 1, 1024);
        break;
      case '--start-rank':
      case '--data-parallel-start-rank':
        dp.startRank = integer(flag, value(), 0, 1_000_000);
        break;
      case '--data-parallel-rank':
        dp.rank = integer(flag, value(), 0, 1_000_000);
        break;
      case '--data-parallel-hybrid-lb':
        dp.hybridLb = on();
        break;
      case '--data-parallel-external-lb':
        dp.externalLb = on();
        break;
      case '--model':
        options.model = value();
        break;
      case '--decode-ms':
        options.decodeMsPerToken = integer(flag, value(), 0, 10_000);
        break;
      case '--speeds':
        timing.speeds = parseSpeeds(flag, value());
        break;
      case '--step-ms':
        timing.stepMs = integer(flag, value(), 1, 10_000);
        break;
      case '--cpu-blocks':
        timing.cpuBlocks = integer(flag, value(), 1, 100_000_000);
        break;
      case '--kv-events-port': {
        const port = integer(flag, value(), 1, 64535 - 1024);
        options.kvEvents = { host: options.host, port, replayPort: port + 1000 };
        break;
      }
      default:
        throw new Error(`unknown option ${JSON.stringify(arg)} (see --help)`);
    }
  }
  if (options.kvEvents) options.kvEvents.host = options.host;
  const engines = managedEngines(dp);
  if (timing.cpuBlocks !== undefined && options.kvEvents === undefined) throw new Error('--cpu-blocks keeps token blocks, which needs the tokenizer of --kv-events-port: add --kv-events-port N');
  if (options.decodeMsPerToken !== undefined && (timing.speeds || timing.stepMs)) throw new Error('--decode-ms times each request alone; --speeds and --step-ms time the engine in steps: give one or the other');
  return { ...options, ...engines, ...timedMockOptions(timing, engines.dataParallelSize ?? 4, '--speeds') };
}

/**
 * The engines a vLLM API server started with these flags manages (its first global rank and
 * how many), decided as vLLM 52a31cc decides its load-balancing mode
 * (vllm/engine/arg_utils.py:1854-1912): `--data-parallel-rank` (or `--data-parallel-external-lb`)
 * is external LB, one engine; `--data-parallel-size-local` with a start rank above 0 (or
 * `--data-parallel-hybrid-lb`) is a hybrid-LB node, its local engines, and external LB when
 * that is one engine; otherwise internal LB, all `--data-parallel-size` engines. Flags vLLM
 * refuses, or ignores to the user's surprise, are refused with the fix.
 */
function managedEngines(dp: DataParallelFlags): Pick<MockVllmOptions, 'dataParallelSize' | 'startRank'> {
  const size = dp.size ?? 4;
  if (dp.hybridLb && dp.externalLb) throw new Error('--data-parallel-hybrid-lb and --data-parallel-external-lb cannot both be given (vLLM refuses them too)');
  if (dp.externalLb || dp.rank !== undefined) {
    if (dp.rank === undefined) throw new Error('--data-parallel-external-lb needs --data-parallel-rank R: the global rank this server runs');
    if (dp.sizeLocal !== undefined && dp.sizeLocal !== 1) throw new Error('--data-parallel-rank runs one engine: --data-parallel-size-local must be 1 or left out');
    if (dp.startRank !== undefined) throw new Error('--data-parallel-rank names this server\'s rank: leave --data-parallel-start-rank out');
    if (dp.rank >= size) throw new Error(`--data-parallel-rank ${dp.rank} is not below --data-parallel-size ${size}`);
    return { dataParallelSize: 1, startRank: dp.rank };
  }
  const start = dp.startRank ?? 0;
  if (dp.sizeLocal === undefined) {
    if (dp.hybridLb || start > 0) {
      throw new Error(`${dp.hybridLb ? '--data-parallel-hybrid-lb' : '--data-parallel-start-rank'} needs --data-parallel-size-local: a node serving ranks S to S+L-1 of N runs with --data-parallel-size N --data-parallel-size-local L --data-parallel-start-rank S`);
    }
    return { dataParallelSize: size, startRank: 0 };
  }
  if (start + dp.sizeLocal > size) throw new Error(`--data-parallel-start-rank ${start} + --data-parallel-size-local ${dp.sizeLocal} passes --data-parallel-size ${size}`);
  const hybrid = (dp.hybridLb || start > 0) && dp.sizeLocal < size;
  // An internal-LB head (start rank 0, no hybrid LB) manages every engine of the deployment;
  // the mock runs them all itself, where vLLM would wait for headless nodes to start the rest.
  return hybrid ? { dataParallelSize: dp.sizeLocal, startRank: start } : { dataParallelSize: size, startRank: 0 };
}

/** Runs the mock until SIGINT or SIGTERM. */
export async function runMockCommand(argv: readonly string[]): Promise<void> {
  let options;
  try {
    options = parseMockCommandLine(argv);
  } catch (error) {
    process.stderr.write(`mock-vllm: ${(error as Error).message}\n`);
    process.exitCode = 2;
    return;
  }
  if (options === 'help') {
    process.stdout.write(`${MOCK_USAGE}\n`);
    return;
  }
  let mock;
  try {
    mock = await startMockVllm(options);
  } catch (error) {
    const problem = listenProblem(error, 'the mock vLLM', `${options.host ?? '127.0.0.1'}:${options.port}`, 'give --port N (0: any free one)');
    process.stderr.write(`mock-vllm: ${(problem as Error).message}\n`);
    process.exitCode = 1;
    return;
  }
  const start = options.startRank ?? 0;
  const count = options.dataParallelSize ?? 4;
  const ranks = `${start}-${start + count - 1} (X-data-parallel-rank 0-${count - 1})`;
  const events = mock.kvEvents ? `; KV events from ${mock.kvEvents.endpoints[0]} (rank ${start}; +1 per rank), replay ${mock.kvEvents.replayEndpoints[0]}` : '';
  // A terminal's Ctrl-C reaches the mock twice under `npm run mock` (from the terminal, and
  // forwarded by npm): the first closes it, the others wait for that.
  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    void mock.close().then(() => process.exit(0));
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  // The listening line last: whoever reads it may signal at once, and a SIGTERM before the
  // handlers would kill node outright (the port freed by the kernel, npm exiting by signal).
  process.stdout.write(`mock vLLM listening on ${mock.url}: model ${options.model ?? 'mock-model'}, ranks ${ranks}${events}\n`);
}
