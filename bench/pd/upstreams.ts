/**
 * bench:pd's upstreams, in a process of their own so that the gateway's CPU is its own: a mock
 * vLLM prefill server and a decode server (NIXL, 4 ranks each) on the ports in PREFILL_PORT and
 * DECODE_PORT. Prints `READY <prefill port>`.
 */
import { startMockVllm } from '../../example-server/mock-vllm';

async function main(): Promise<void> {
  const prefill = await startMockVllm({ role: 'prefill', port: Number(process.env.PREFILL_PORT), dataParallelSize: 4 });
  await startMockVllm({ role: 'decode', port: Number(process.env.DECODE_PORT), dataParallelSize: 4 });
  process.stdout.write(`READY ${prefill.port}\n`);
}

process.on('SIGTERM', () => process.exit(0));
process.stdout.on('error', () => undefined);
void main();
