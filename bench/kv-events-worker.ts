/** The worker thread of bench/kv-events-pause.ts: decodes each payload it is sent and posts the batch back. */
import { parentPort } from 'node:worker_threads';
import { decodeKvEventBatch } from '../lib/exact-prefix/events/decode';

parentPort?.on('message', ({ id, payload }: { id: number; payload: Uint8Array }) => {
  parentPort?.postMessage({ id, result: decodeKvEventBatch(payload) });
});
