/**
 * `npx tsx example-server/mock-vllm.ts [options]` (or `npm run mock -- [options]`): the mock
 * vLLM on its own, for library users who want an upstream to point `dpRouter()` at without a GPU.
 */
import { listenProblem } from '../listen-problem';
import { startMockVllm } from '../mock-vllm';
import type { MockVllmOptions } from './types';

export const MOCK_USAGE = `Usage: npx tsx example-server/mock-vllm.ts [options]

A mock vLLM OpenAI-compatible server with data parallelism (vllm serve … --data-parallel-size N):
/v1/chat/completions, /v1/completions (SSE too), /v1/models, /tokenize, /health, /metrics.

Options:
  --port N              port (0 = any free one)                          [8000]
  --host H              bind address                                     [127.0.0.1]
  --dp-size N           data-parallel ranks served                       [4]
  --start-rank N        first global rank (--data-parallel-start-rank)   [0]
  --model NAME          served model name                                [mock-model]
  --decode-ms N         delay per generated token                        [0]
  --kv-events-port N    publish KV-cache events as vLLM's --kv-events-config does: rank r
                        on tcp://HOST:N+r, its replay socket on N+1000+r [off]
  -h, --help            print this help`;

/** Reads the mock's command line; `'help'` when help was asked for. Throws an `Error` with a one-line reason. */
export function parseMockCommandLine(argv: readonly string[]): MockVllmOptions | 'help' {
  const options: MockVllmOptions = { port: 8000 };
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
    switch (flag) {
      case '--port':
        options.port = integer(flag, value(), 0, 65535);
        break;
      case '--host':
        options.host = value();
        break;
      case '--dp-size':
        options.dataParallelSize = integer(flag, value(), 1, 1024);
        break;
      case '--start-rank':
        options.startRank = integer(flag, value(), 0, 1_000_000);
        break;
      case '--model':
        options.model = value();
        break;
      case '--decode-ms':
        options.decodeMsPerToken = integer(flag, value(), 0, 10_000);
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
  return options;
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
  const ranks = `${start}-${start + (options.dataParallelSize ?? 4) - 1}`;
  const events = mock.kvEvents ? `; KV events from ${mock.kvEvents.endpoints[0]} (rank ${start}; +1 per rank), replay ${mock.kvEvents.replayEndpoints[0]}` : '';
  process.stdout.write(`mock vLLM listening on ${mock.url}: model ${options.model ?? 'mock-model'}, ranks ${ranks}${events}\n`);
  const stop = () => {
    void mock.close().then(() => process.exit(0));
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}
