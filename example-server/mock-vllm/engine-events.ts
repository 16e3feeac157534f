/**
 * The mock engine's KV-event stream (`kvEvents` option): validates the option, binds each
 * rank's publisher and replay socket, and sends what the ranks' token caches report.
 */
import { startMockKvPublisher, type KvLayout, type MockKvEvent, type MockKvPublisher } from './kv-events';
import { lowBits } from './cpu-tier';
import { MOCK_TOKENIZER_DIR } from './tokenize';
import type { MockKvEvents, MockKvEventsOptions } from './types';

const LAYOUTS: readonly KvLayout[] = ['current', 'v0.9', 'v0.10', 'array-batch', 'map'];
const KEYS = new Set(['host', 'port', 'replayPort', 'layout', 'topic', 'bufferSteps', 'hybrid', 'offload']);

/** The option with every default filled in. */
export type KvEventsConfig = Required<MockKvEventsOptions>;

/** Fills the defaults and checks `kvEvents` for ranks up to `lastRank`; throws a TypeError naming the field. */
export function resolveKvEventsOptions(options: MockKvEventsOptions, lastRank: number): KvEventsConfig {
  const path = 'startMockVllm: kvEvents';
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new TypeError(`${path} must be an object such as { port: 5557 } or {} for the defaults, got ${String(options)}`);
  }
  for (const key of Object.keys(options)) {
    if (!KEYS.has(key)) throw new TypeError(`${path}.${key} is not an option; known: ${[...KEYS].join(', ')}`);
  }
  const config: KvEventsConfig = {
    host: options.host ?? '127.0.0.1',
    port: options.port ?? 0,
    replayPort: options.replayPort === undefined ? 0 : options.replayPort,
    layout: options.layout ?? 'current',
    topic: options.topic ?? '',
    bufferSteps: options.bufferSteps ?? 10_000,
    hybrid: options.hybrid ?? false,
    offload: options.offload ?? false,
  };
  if (typeof config.host !== 'string' || config.host === '') throw new TypeError(`${path}.host must be an address such as '127.0.0.1', got ${String(config.host)}`);
  for (const name of ['port', 'replayPort'] as const) {
    const port = config[name];
    if (name === 'replayPort' && port === null) continue;
    if (!Number.isSafeInteger(port) || (port as number) < 0 || (port as number) + (port === 0 ? 0 : lastRank) > 65535) {
      throw new TypeError(`${path}.${name} must be 0 (ports of the OS's choice) or a port that stays <= 65535 after adding the global rank ${lastRank}, got ${String(port)}`);
    }
  }
  if (!LAYOUTS.includes(config.layout)) throw new TypeError(`${path}.layout must be one of ${LAYOUTS.map((one) => `'${one}'`).join(', ')}, got ${String(config.layout)}`);
  if (typeof config.topic !== 'string') throw new TypeError(`${path}.topic must be a string, got ${String(config.topic)}`);
  if (!Number.isSafeInteger(config.bufferSteps) || config.bufferSteps < 1) {
    throw new TypeError(`${path}.bufferSteps must be an integer >= 1, got ${String(config.bufferSteps)}`);
  }
  for (const name of ['hybrid', 'offload'] as const) {
    if (typeof config[name] !== 'boolean') throw new TypeError(`${path}.${name} must be true or false, got ${String(config[name])}`);
  }
  return config;
}

/** A bound KV-event stream: what the mock reports, and where the engine sends its events. */
export interface EngineEvents {
  readonly info: MockKvEvents;
  /** Publishes one batch of `rank`'s events; never throws (a send after close is dropped). */
  publish(rank: number, events: MockKvEvent[]): void;
  close(): Promise<void>;
}

/** Binds a PUB (and a replay ROUTER) per global rank in `ranks`. */
export async function startEngineEvents(config: KvEventsConfig, ranks: readonly number[], blockTokens: number): Promise<EngineEvents> {
  const publisher: MockKvPublisher = await startMockKvPublisher({
    ranks,
    host: config.host,
    layout: config.layout,
    topic: config.topic,
    bufferSteps: config.bufferSteps,
    ports: { base: config.port, replayBase: config.replayPort ?? 0 },
    replay: config.replayPort !== null,
  });
  const toDrop = new Map<number, number>();
  return {
    info: {
      ranks: [...ranks],
      endpoints: publisher.endpoints,
      replayEndpoints: publisher.replayEndpoints,
      topic: config.topic,
      blockTokens,
      tokenizer: MOCK_TOKENIZER_DIR,
      drop(rank, batches = 1) {
        if (!ranks.includes(rank)) throw new RangeError(`the mock publishes no rank ${rank}`);
        toDrop.set(rank, (toDrop.get(rank) ?? 0) + batches);
      },
    },
    publish(rank, events) {
      const dropping = toDrop.get(rank) ?? 0;
      if (dropping > 0) toDrop.set(rank, dropping - 1);
      publisher.publish(rank, shaped(events, config), { drop: dropping > 0 }).catch(() => {});
    },
    close: () => publisher.close(),
  };
}

/**
 * The cache's events (one full-attention group) as the configured model publishes them: a
 * hybrid model's sliding-window group 0 before its full-attention group 1, and an offloading
 * connector's CPU stores after the GPU events (scheduler.py appends the connector's events).
 */
function shaped(events: MockKvEvent[], config: KvEventsConfig): MockKvEvent[] {
  const mapEvents = config.layout === 'array-batch' || config.layout === 'map';
  if (!config.hybrid && !config.offload && !mapEvents) return events;
  const out: MockKvEvent[] = [];
  if (config.hybrid) {
    for (const event of events) {
      // A CPU tier's events (cpu-tier.ts) name no attention group: the connector's carry none.
      if (event.type === 'AllBlocksCleared' || (event.medium != null && event.medium !== 'GPU')) {
        out.push(event);
        continue;
      }
      if (event.type === 'BlockRemoved') {
        out.push({ ...event, groupIdx: 0 }, { ...event, groupIdx: 1 });
        continue;
      }
      out.push({ ...event, groupIdx: 0, kvCacheSpecKind: 'sliding_window', kvCacheSpecSlidingWindow: event.blockSize });
      // The window is one block: the run's blocks before its last are freed, and evicted first.
      for (const hash of event.blockHashes.slice(0, -1)) out.push({ type: 'BlockRemoved', blockHashes: [hash], medium: 'GPU', groupIdx: 0 });
      out.push({ ...event, groupIdx: 1, kvCacheSpecKind: 'full_attention' });
    }
  } else {
    out.push(...events);
  }
  if (config.offload) {
    for (const event of events) {
      if (event.type !== 'BlockStored') continue;
      // As OffloadingConnectorScheduler.take_events builds them (offloading/scheduler.py).
      out.push({ type: 'BlockStored', blockHashes: event.blockHashes, parentBlockHash: null, tokenIds: [], blockSize: 0, loraId: null, medium: 'CPU', loraName: null });
    }
  }
  // The cache's own CPU tier (cpuBlocksPerRank) in newer vLLM's form (its events are maps); `offload`'s stores stay as they were.
  if (mapEvents) return out.flatMap(newerCpuEvent);
  return out;
}

/**
 * A CPU tier's event as newer vLLM publishes it (fixtures/vllm-db92053/offload-cpu.json): one
 * `BlockStored` per block with the GPU event's int hash and `group_idx` 0, a `BlockRemoved` per
 * group (offloading/events.py:317-413 at db92053). Other events pass as they are.
 */
function newerCpuEvent(event: MockKvEvent): MockKvEvent[] {
  // Only the tier's own (bytes-hashed) events: `offload`'s synthetic stores keep their form.
  if (event.type === 'AllBlocksCleared' || event.medium !== 'CPU' || !(event.blockHashes[0] instanceof Uint8Array)) return [event];
  const hashes = event.blockHashes.map((hash) => (hash instanceof Uint8Array ? lowBits(hash) : hash));
  if (event.type === 'BlockRemoved') return [{ ...event, blockHashes: hashes, groupIdx: 0 }];
  return hashes.map((hash) => ({ ...event, blockHashes: [hash], groupIdx: 0 }));
}
