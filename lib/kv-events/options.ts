/**
 * The options of exact prefix routing: `upstreams[].kvEvents` and `prefixAware.tokenizer`,
 * validated once at creation.
 */
import { fail, isPlainObject, rejectUnknownKeys, shown } from '../option-checks';
import { resolveKvEndpoints } from './endpoints';
import type { KvEventsSource } from './exact-routing';
import { PromptTokenizer } from './tokenizer';

/** Where an upstream publishes KV events, as given in `upstreams[].kvEvents`. */
export interface KvEventsOptions {
  /**
   * Rank 0's publisher, as vLLM's `--kv-events-config` `endpoint` with the host it publishes
   * on, e.g. `'tcp://10.0.0.5:5557'`: rank r's is this port + r (vLLM offsets each engine's
   * publisher by its global data-parallel rank, even for an upstream whose `startRank` is
   * higher). An array names each served rank's endpoint instead, in rank order (external
   * load balancing). Required.
   */
  endpoint: string | readonly string[];
  /**
   * Rank 0's replay socket (`replay_endpoint`), offset like `endpoint`, or one per served rank.
   * With it, a gap in a rank's event sequence is filled from the engine's buffer and a router
   * that starts late learns what was cached before; without it, a gap clears that rank's index.
   * Default: none.
   */
  replayEndpoint?: string | readonly string[];
  /** The topic vLLM publishes under (`topic`). Default: `''`. */
  topic?: string;
}

const KV_EVENTS_KEYS = ['endpoint', 'replayEndpoint', 'topic'] as const;

/** `upstreams[i].kvEvents`, checked against the ranks it serves; `undefined` when not given. */
export function parseKvEvents(path: string, value: unknown, ranks: readonly number[]): KvEventsSource | undefined {
  if (value === undefined) return undefined;
  if (!isPlainObject(value)) fail(path, `must be an object, got ${shown(value)}`, "Use e.g. `kvEvents: { endpoint: 'tcp://10.0.0.5:5557', replayEndpoint: 'tcp://10.0.0.5:5558' }`.");
  rejectUnknownKeys(path, value, KV_EVENTS_KEYS);
  if (value.endpoint === undefined) fail(`${path}.endpoint`, 'is required', "Give rank 0's publisher, e.g. `endpoint: 'tcp://10.0.0.5:5557'`.");
  const endpoint = endpointOption(`${path}.endpoint`, value.endpoint, ranks);
  const replayEndpoint = value.replayEndpoint === undefined ? undefined : endpointOption(`${path}.replayEndpoint`, value.replayEndpoint, ranks);
  const topic = value.topic ?? '';
  if (typeof topic !== 'string') fail(`${path}.topic`, `must be a string, got ${shown(value.topic)}`, "Use vLLM's `topic`, or leave it out for ''.");
  return { endpoint, ...(replayEndpoint !== undefined && { replayEndpoint }), topic };
}

function endpointOption(path: string, value: unknown, ranks: readonly number[]): string | readonly string[] {
  if (typeof value !== 'string' && !(Array.isArray(value) && value.every((one) => typeof one === 'string'))) {
    fail(path, `must be a ZeroMQ endpoint or an array of them, got ${shown(value)}`, "Use e.g. `'tcp://10.0.0.5:5557'`.");
  }
  try {
    resolveKvEndpoints(value as string | string[], ranks, path);
  } catch (error) {
    // resolveKvEndpoints names the path and the fix; only the form of the message changes.
    const message = (error as Error).message;
    const problem = message.startsWith(path) ? message.slice(path.length).replace(/^:? /, '') : message;
    fail(path, problem.replace(/\.$/, ''), "vLLM's `--kv-events-config` binds `tcp://*:PORT`; connect to its host.");
  }
  return Array.isArray(value) ? [...value] : (value as string);
}

/** `prefixAware.tokenizer`, loaded now so that a wrong path fails at creation; `undefined` when not given. */
export function parseTokenizer(path: string, value: unknown): PromptTokenizer | undefined {
  if (value === undefined) return undefined;
  const files = typeof value === 'string' || (Array.isArray(value) && value.length === 2 && value.every((one) => typeof one === 'string'));
  if (!files) {
    fail(path, `must be a path or two paths, got ${shown(value)}`, "Use the model's directory holding tokenizer.json and tokenizer_config.json, e.g. `tokenizer: '/models/llama-3.1-8b'`.");
  }
  try {
    return PromptTokenizer.load(value as string | [string, string]);
  } catch (error) {
    return fail(path, `could not be loaded: ${(error as Error).message}`, "Point it at the model's tokenizer.json and tokenizer_config.json (the files the engine serves).");
  }
}
