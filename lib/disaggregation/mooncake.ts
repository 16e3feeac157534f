import { get as httpGet } from 'node:http';
import type { UpstreamConfig } from '../upstreams/upstream-options';

/** vLLM's `VLLM_MOONCAKE_BOOTSTRAP_PORT` default. */
export const BOOTSTRAP_PORT = 8998;
/** A bootstrap answer is a few hundred bytes per rank. */
const MAX_QUERY_BYTES = 1024 * 1024;
/** After a failed or incomplete query, ask again at most this often. */
const REQUERY_MS = 1_000;

/** The bootstrap server of a prefill upstream: `http://<its host>:<bootstrapPort>`. */
export function bootstrapAddress(upstream: UpstreamConfig): string {
  const url = new URL(upstream.url);
  return `http://${url.hostname}:${upstream.bootstrapPort ?? BOOTSTRAP_PORT}`;
}

/**
 * Engine ids by data-parallel rank from a bootstrap server's `GET /query` answer, in either shape
 * vLLM has shipped: `{"<rank>": {"engine_id": …, "worker_addr": …}}` (the current connector) or
 * `{"<engine id>": {"<rank>": …}}` (the older proxy's). `undefined` when it is neither.
 */
export function parseBootstrapQuery(text: string): Map<number, string> | undefined {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!isObject(value)) return undefined;
  const engines = new Map<number, string>();
  for (const [key, entry] of Object.entries(value)) {
    if (!isObject(entry)) return undefined;
    if (typeof entry.engine_id === 'string') {
      const rank = rankOf(key);
      if (rank === undefined) return undefined;
      engines.set(rank, entry.engine_id);
    } else {
      for (const inner of Object.keys(entry)) {
        const rank = rankOf(inner);
        if (rank === undefined) return undefined;
        engines.set(rank, key);
      }
    }
  }
  return engines;
}

/**
 * The engine ids of every prefill upstream's ranks, asked of its bootstrap server when first
 * needed and again when a rank is missing (an engine restarted under a new id, or had not
 * registered yet), at most once a second per upstream.
 */
export class BootstrapDirectory {
  private readonly known = new Map<string, { engines: Map<number, string>; asked: number; pending?: Promise<void> }>();

  constructor(private readonly timeoutMs: number) {}

  /** The engine id serving global `rank` of `upstream` ({@link bootstrapKey}); `undefined` when the bootstrap server does not say. */
  async engineOf(upstream: UpstreamConfig, rank: number): Promise<string | undefined> {
    const address = bootstrapAddress(upstream);
    let entry = this.known.get(address);
    const found = entry && lookup(entry.engines, upstream, rank);
    if (found !== undefined) return found;
    if (entry === undefined) {
      entry = { engines: new Map(), asked: -Infinity };
      this.known.set(address, entry);
    }
    const current = entry;
    if (current.pending === undefined && performance.now() - current.asked >= REQUERY_MS) {
      current.asked = performance.now();
      current.pending = query(address, this.timeoutMs).then((engines) => {
        if (engines !== undefined) current.engines = engines;
        current.pending = undefined;
      });
    }
    await current.pending;
    return lookup(current.engines, upstream, rank);
  }
}

function lookup(engines: Map<number, string>, upstream: UpstreamConfig, rank: number): string | undefined {
  return engines.get(bootstrapKey(upstream, rank));
}

/**
 * Where a bootstrap server files the engine of global `rank`: its position from 0 among the
 * engines the server manages, rank − startRank, in every mode. vLLM 52a31cc registers each
 * engine under `data_parallel_rank_local` on a hybrid or external-LB server and under its global
 * index on an internal-LB one, whose start rank is 0 (mooncake_utils.py:20-25
 * `get_mooncake_dp_engine_index`, mooncake_connector.py:790), and its own proxy asks for the key
 * it sends as `X-data-parallel-rank` (examples/disaggregated/mooncake_connector/
 * mooncake_connector_proxy.py:56-57, 271). Taking the global rank first would name another
 * engine of a node whose start rank is below its size (global 2 of a node at start 2 is its
 * engine "0", but "2" is there too).
 */
export function bootstrapKey(upstream: UpstreamConfig, rank: number): number {
  return rank - upstream.startRank;
}

/**
 * `GET /query`, given up after `timeoutMs` in all: a socket timeout alone measures idleness, and
 * a server sending a byte now and then would hold every request for that prefill server.
 */
function query(address: string, timeoutMs: number): Promise<Map<number, string> | undefined> {
  return new Promise((resolve) => {
    const deadline = setTimeout(() => request.destroy(), timeoutMs);
    const settle = (engines: Map<number, string> | undefined) => {
      clearTimeout(deadline);
      resolve(engines);
    };
    const request = httpGet(`${address}/query`, (answer) => {
      const chunks: Buffer[] = [];
      let size = 0;
      answer.on('data', (chunk: Buffer) => {
        size += chunk.length;
        if (size > MAX_QUERY_BYTES) request.destroy();
        else chunks.push(chunk);
      });
      answer.on('end', () => settle(answer.statusCode === 200 ? parseBootstrapQuery(Buffer.concat(chunks).toString('utf8')) : undefined));
      answer.on('error', () => settle(undefined));
    });
    request.on('error', () => settle(undefined));
    request.on('close', () => settle(undefined));
  });
}

function rankOf(key: string): number | undefined {
  return /^(0|[1-9][0-9]{0,9})$/.test(key) ? Number(key) : undefined;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
