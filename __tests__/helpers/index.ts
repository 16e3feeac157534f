// The test helpers, one import away: `import { startGateway, waitFor } from './helpers'`.
export * from './app';
export * from './echo-upstream';
export * from './exchange';
export * from './fixtures';
export * from './lifecycle';
export * from './prometheus';
export * from './raw-http';
export * from './vllm';
export * from './wait';
