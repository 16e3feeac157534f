/**
 * The mock's prefill and decode roles, with the KV connectors' semantics a gateway can observe
 * (docs/disaggregation.md): a prefill request (`kv_transfer_params.do_remote_decode`) that
 * finishes at its length cap keeps its blocks and, with NIXL, answers the parameters a decode
 * needs; a decode request (`do_remote_prefill`) must name a transfer a prefill made, once.
 * Transfers live in one table per process, as the mocks of one `npm start -- --pd` share it.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

/** Which leg the mock serves. */
export type MockRole = 'prefill' | 'decode' | 'both';
/** The KV connector it plays. */
export type MockConnector = 'nixl' | 'mooncake';

/** What the role check makes of a generation request. */
export type PdAdmission =
  /** Served as a whole request, as any vLLM server would. */
  | { readonly kind: 'whole' }
  /** A prefill: answer with these `kv_transfer_params` (NIXL), or register the transfer (Mooncake). */
  | { readonly kind: 'prefill'; readonly params: string | undefined; readonly commit: () => void }
  /** A decode of a transfer: the prompt's KV cache came from the prefill. */
  | { readonly kind: 'decode' }
  | { readonly kind: 'refused'; readonly message: string }
  /** Taken, but the KV cache could not be read: the prefill released its blocks (its lease ran out). */
  | { readonly kind: 'failed'; readonly message: string };

interface Transfer {
  readonly engineId: string;
  consumed: boolean;
  /** NIXL: when the prefill releases the blocks (`performance.now()`), unless a decode has them. */
  readonly expires: number;
}

/** Every transfer a prefill mock made in this process: NIXL's by `engine/request id`, Mooncake's by `transfer_id`. */
const TRANSFERS = new Map<string, Transfer>();
/** Decodes waiting for a Mooncake prefill that has not arrived yet (both legs are sent at once). */
const WAITERS = new Map<string, Array<() => void>>();
/** How long a Mooncake decode waits for its prefill, like the connector's own wait for blocks. */
const MOONCAKE_WAIT_MS = 5_000;
/** The NIXL side-channel base port (`VLLM_NIXL_SIDE_CHANNEL_PORT`); rank r listens on base + r. */
const SIDE_CHANNEL_PORT = 5600;

const NIXL_DECODE_KEYS = ['remote_block_ids', 'remote_engine_id', 'remote_request_id', 'remote_host', 'remote_port'];
const MOONCAKE_DECODE_KEYS = ['remote_bootstrap_addr', 'remote_engine_id', 'transfer_id'];

/** One mock's role: its engines' ids and the checks of each generation request. */
export class PdRole {
  /** Engine id by global rank (vLLM's `kv_transfer_config.engine_id`, a uuid). */
  readonly engines: ReadonlyMap<number, string>;

  /**
   * `kvLeaseMs`: how long a NIXL prefill keeps a request's blocks for its decode, as vLLM 52a31cc's
   * `kv_lease_duration` (30 s; nixl/scheduler.py:70-73, 642): a decode that comes later fails
   * to load them, which vLLM's default `kv_load_failure_policy: 'fail'` answers as an internal error.
   */
  constructor(
    readonly role: MockRole,
    readonly connector: MockConnector,
    ranks: readonly number[],
    private readonly blockTokens: number,
    private readonly kvLeaseMs = 30_000,
  ) {
    this.engines = new Map(ranks.map((rank) => [rank, randomUUID()]));
  }

  /** Judges a generation body served by global `rank`; `eos` says the generation stops before its length cap. */
  async admit(body: Record<string, unknown>, rank: number, requestId: string | undefined, promptTokens: number, eos: boolean): Promise<PdAdmission> {
    if (body.stream_options != null && body.stream !== true) return refused('Stream options can only be defined when `stream=True`.');
    const maxTokens = (body.max_completion_tokens ?? body.max_tokens ?? 16) as number;
    if (typeof body.min_tokens === 'number' && body.min_tokens > maxTokens) return refused('min_tokens must be less than or equal to max_tokens.');
    const params = body.kv_transfer_params;
    if (params == null) return { kind: 'whole' };
    if (typeof params !== 'object' || Array.isArray(params)) return refused('kv_transfer_params must be an object.');
    const kv = params as Record<string, unknown>;
    if (kv.do_remote_decode === true) {
      if (this.role === 'decode') return refused('This is a decode server: it does not serve prefill requests (do_remote_decode).');
      return this.prefill(kv, rank, requestId, promptTokens, eos, body.stream === true);
    }
    if (kv.do_remote_prefill === true) {
      if (this.role === 'prefill') return refused('This is a prefill server: it does not serve decode requests (do_remote_prefill).');
      return this.connector === 'nixl' ? this.decodeNixl(kv) : this.decodeMooncake(kv);
    }
    return { kind: 'whole' };
  }

  private prefill(kv: Record<string, unknown>, rank: number, requestId: string | undefined, promptTokens: number, eos: boolean, stream: boolean): PdAdmission {
    const engineId = this.engines.get(rank)!;
    if (this.connector === 'mooncake') {
      const transferId = kv.transfer_id;
      // The current connector warns and transfers nothing without one; the mock refuses, to be seen.
      if (typeof transferId !== 'string') return refused('kv_transfer_params.transfer_id is required by the Mooncake connector.');
      return { kind: 'prefill', params: undefined, commit: () => register(`mooncake/${transferId}`, engineId) };
    }
    // NIXL keeps the blocks, and says where they are, only for a request finished by its length cap.
    if (eos || stream) return { kind: 'prefill', params: undefined, commit: () => undefined };
    const requestKey = `${requestId ?? randomUUID()}-${randomUUID().slice(0, 8)}`;
    const blocks = Math.max(1, Math.ceil(promptTokens / this.blockTokens));
    const params = JSON.stringify({
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_block_ids: Array.from({ length: blocks }, (_, index) => index),
      remote_engine_id: engineId,
      remote_request_id: requestKey,
      remote_host: '127.0.0.1',
      remote_port: SIDE_CHANNEL_PORT + rank,
      tp_size: 1,
    });
    return { kind: 'prefill', params, commit: () => register(`nixl/${engineId}/${requestKey}`, engineId, performance.now() + this.kvLeaseMs) };
  }

  private decodeNixl(kv: Record<string, unknown>): PdAdmission {
    const missing = NIXL_DECODE_KEYS.filter((key) => kv[key] == null);
    if (missing.length > 0) return refused(`kv_transfer_params lacks ${missing.join(', ')}: not from a prefill.`);
    return consume(TRANSFERS.get(`nixl/${String(kv.remote_engine_id)}/${String(kv.remote_request_id)}`));
  }

  private async decodeMooncake(kv: Record<string, unknown>): Promise<PdAdmission> {
    const missing = MOONCAKE_DECODE_KEYS.filter((key) => typeof kv[key] !== 'string');
    if (missing.length > 0) return refused(`kv_transfer_params lacks ${missing.join(', ')}: not a Mooncake decode request.`);
    const key = `mooncake/${String(kv.transfer_id)}`;
    if (!TRANSFERS.has(key)) await arrival(key);
    const transfer = TRANSFERS.get(key);
    if (transfer !== undefined && transfer.engineId !== kv.remote_engine_id) return refused(`Transfer ${String(kv.transfer_id)} was prefilled by another engine than remote_engine_id.`);
    return consume(transfer);
  }

  /**
   * Mooncake's bootstrap server (`VLLM_MOONCAKE_BOOTSTRAP_PORT`): `GET /query` names each
   * engine, keyed as vLLM 52a31cc registers them: by `data_parallel_rank_local` on a hybrid or
   * external-LB server and by the global index otherwise, which is the same position from 0
   * among the engines this server manages, the one `X-data-parallel-rank` takes
   * (mooncake_utils.py:20-25 `get_mooncake_dp_engine_index`, mooncake_connector.py:790).
   */
  async startBootstrap(host: string, port: number): Promise<{ port: number; close(): Promise<void> }> {
    const answer = JSON.stringify(
      Object.fromEntries(
        [...this.engines].map(([rank, engineId], index) => [String(index), { engine_id: engineId, worker_addr: { '0': { '0': `${host}:${17000 + rank}` } } }]),
      ),
    );
    const server: Server = createServer((req, res) => {
      if (req.method === 'GET' && req.url === '/query') {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) });
        res.end(answer);
      } else {
        res.writeHead(404, { 'content-length': 0 });
        res.end();
      }
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => resolve());
    });
    return {
      port: (server.address() as AddressInfo).port,
      close: () =>
        new Promise<void>((resolve) => {
          server.closeAllConnections();
          server.close(() => resolve());
        }),
    };
  }
}

function refused(message: string): PdAdmission {
  return { kind: 'refused', message };
}

function register(key: string, engineId: string, expires = Infinity): void {
  TRANSFERS.set(key, { engineId, consumed: false, expires });
  // Bounded like a KV cache: the oldest transfers go first.
  if (TRANSFERS.size > 100_000) TRANSFERS.delete(TRANSFERS.keys().next().value!);
  const waiting = WAITERS.get(key);
  WAITERS.delete(key);
  waiting?.forEach((wake) => wake());
}

function consume(transfer: Transfer | undefined): PdAdmission {
  if (transfer === undefined) return refused('kv_transfer_params name a transfer no prefill made.');
  if (transfer.consumed) return refused('kv_transfer_params name a transfer already read by a decode.');
  transfer.consumed = true;
  if (performance.now() > transfer.expires) return { kind: 'failed', message: 'Internal server error' };
  return { kind: 'decode' };
}

function arrival(key: string): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, MOONCAKE_WAIT_MS);
    const waiting = WAITERS.get(key) ?? [];
    waiting.push(() => {
      clearTimeout(timer);
      resolve();
    });
    WAITERS.set(key, waiting);
  });
}
