import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';

/** A mock vLLM that can be killed and brought back on the same port. */
export interface RestartableVllm {
  readonly url: string;
  readonly current: MockVllm | undefined;
  kill(): Promise<void>;
  restart(): Promise<void>;
  close(): Promise<void>;
}

export async function startRestartableVllm(options: MockVllmOptions = {}): Promise<RestartableVllm> {
  let mock: MockVllm | undefined = await startMockVllm(options);
  const port = mock.port;
  return {
    url: mock.url,
    get current() {
      return mock;
    },
    async kill() {
      await mock?.close();
      mock = undefined;
    },
    async restart() {
      mock = await startMockVllm({ ...options, port });
    },
    async close() {
      await mock?.close();
      mock = undefined;
    },
  };
}
