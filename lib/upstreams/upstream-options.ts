import { parseDiscover, type DiscoverOptions } from './engine-watch-options';
import { parseKvEvents } from '../exact-prefix/options';
import type { KvEventsOptions } from '../exact-prefix/events/source';
import { redactUrl, upstreamUrlProblem } from './upstream-url';
import { fail, integerOption, isPlainObject, oneOf, rejectUnknownKeys, shown, type KeysEnum } from '../option-checks';
import { parseUpstreamDns, type DnsConfig, type UpstreamDnsOptions } from './dns-options';
import { parseModels } from './model-options';

/** What the proxied request's rank header carries for an upstream. */
export type RankHeaderMode = 'global' | 'local' | 'none';

/** Which leg of a disaggregated request an upstream serves (`disaggregation`); `'both'` serves whole requests and either leg. */
export type UpstreamRole = 'prefill' | 'decode' | 'both';

/** One vLLM OpenAI-compatible server (one API server of a data-parallel deployment). */
export interface UpstreamOptions {
  /**
   * The server's URL, `http:` or `https:`, e.g. `'http://10.0.0.5:8000'`. Required. A path
   * prefix (`'http://ingress/vllm-a'`) is kept before each request's path; a path ending in
   * `/v1`, a query, a fragment or `user:password@` is an `OptionError`.
   */
  url: string;
  /** Metric label and decision name. Default: the URL's origin. */
  name?: string;
  /** How many data-parallel ranks this server serves (`--data-parallel-size`). Default: `1`. */
  dataParallelSize?: number;
  /** The first global rank it serves (`--data-parallel-start-rank`). Default: `0`. */
  startRank?: number;
  /**
   * Route only to these global ranks. Default: every rank it serves. With `discover`, the ranks
   * routed to are those of these that the server serves: discovery narrows them, never widens.
   */
  ranks?: readonly number[];
  /**
   * The rank header value sent to this upstream: `'local'`, rank − startRank, the index from 0
   * into the engines the server manages, which is what vLLM's API server reads in every mode
   * (internal load balancing, where startRank is 0 and it is the global rank; a hybrid-LB node;
   * an external-LB server, which takes only 0); `'global'`, the global rank, for a server that
   * reads it so; or `'none'`, no header (external load balancing: the URL selects the rank).
   * Default: `'local'`.
   */
  rankHeader?: RankHeaderMode;
  /**
   * Learn the global ranks this server serves from the distinct `engine` labels of its
   * `/metrics` (start rank = the smallest), at start and every `intervalMs`, and route to them
   * (to those `ranks` lists, when given); the configured ranks stand until the first answer and
   * whenever the server cannot be read. `true` takes
   * the defaults of {@link DiscoverOptions}. Default: `false`.
   */
  discover?: boolean | DiscoverOptions;
  /**
   * Where this server's engines publish KV-cache events (vLLM's `--kv-events-config`, whose
   * `endpoint` must bind `tcp://*:PORT`: with a host name vLLM's publisher connects out instead):
   * with `prefixAware.tokenizer`, the `prefix-aware` policy routes its ranks on the blocks the
   * engines report holding (docs/exact-prefix-routing.md, docs/vllm-compatibility.md). Default: none.
   */
  kvEvents?: KvEventsOptions;
  /**
   * The model names this server serves (its `--served-model-name`s and LoRA adapters): a
   * request's `model` goes only to upstreams that serve it. With `discover`, the names its
   * `GET /v1/models` lists are added. Default: none given, it serves every model.
   */
  models?: readonly string[];
  /**
   * Which leg of a disaggregated request this server serves (needs `disaggregation`):
   * `'prefill'`, `'decode'`, or `'both'` (whole requests; with `disaggregation`, either leg).
   * Default: `'both'`.
   */
  role?: UpstreamRole;
  /**
   * The port of this prefill server's Mooncake bootstrap server (vLLM's
   * `VLLM_MOONCAKE_BOOTSTRAP_PORT`), asked `GET /query` for its engines; read only with
   * `disaggregation.connector: 'mooncake'`. Default: `8998`.
   */
  bootstrapPort?: number;
}

/**
 * Upstreams found by DNS: `dns` instead of `url`; each address the name resolves to becomes an
 * upstream with the other fields, named `<name>/<address>` (the address alone without `name`).
 */
export interface DnsUpstreamOptions extends Omit<UpstreamOptions, 'url'> {
  /** The name to resolve, the port, the interval, the DNS servers to ask and how many addresses to use. Required. */
  dns: UpstreamDnsOptions;
  url?: never;
}

/** One entry of `upstreams`: a server by URL, or the servers a DNS name resolves to. */
export type UpstreamEntry = UpstreamOptions | DnsUpstreamOptions;

/** One upstream, resolved. */
export interface UpstreamConfig {
  readonly name: string;
  readonly url: string;
  readonly startRank: number;
  readonly dataParallelSize: number;
  /** The global ranks routed to, ascending. */
  readonly ranks: readonly number[];
  /** The `ranks` option as given (ascending); `undefined` when left out. Discovery never routes past it. */
  readonly rankList?: readonly number[];
  readonly rankHeader: RankHeaderMode;
  /** How often the ranks are learned from the upstream's `/metrics`; `undefined` when not. */
  readonly discoverIntervalMs: number | undefined;
  /** Where its engines publish KV events; absent when not given. */
  readonly kvEvents?: KvEventsOptions;
  /** The configured model names; `undefined`: every model (unless discovery learns them). */
  readonly models?: readonly string[];
  /** Present on a DNS entry (a template whose `url` is a placeholder) and on the upstreams made from it. */
  readonly dns?: DnsConfig;
  readonly role: UpstreamRole;
  /** The Mooncake bootstrap port as given; `undefined` when not. */
  readonly bootstrapPort?: number;
}

const DATA_PARALLEL_SIZE = 1;
const START_RANK = 0;
const RANK_HEADER: RankHeaderMode = 'local';
const RANK_HEADER_MODES: readonly RankHeaderMode[] = ['global', 'local', 'none'];
const ROLES: readonly UpstreamRole[] = ['prefill', 'decode', 'both'];
/** vLLM's engine count bound: the largest data-parallel size an upstream may declare. */
const MAX_DATA_PARALLEL_SIZE = 65_536;
/** Ten decimal digits: the rank header grammar's bound. */
const MAX_RANK = 9_999_999_999;

const UPSTREAM_KEYS: KeysEnum<UpstreamOptions & Pick<DnsUpstreamOptions, 'dns'>> = {
  url: true,
  name: true,
  dataParallelSize: true,
  startRank: true,
  ranks: true,
  rankHeader: true,
  discover: true,
  kvEvents: true,
  models: true,
  dns: true,
  role: true,
  bootstrapPort: true,
};

/** Whether two configurations reach the same server's ranks with the same header values: a change of either calls for a new look at what the server says. */
export function reachedAlike(a: UpstreamConfig, b: UpstreamConfig): boolean {
  return (
    a.name === b.name &&
    a.url === b.url &&
    a.startRank === b.startRank &&
    a.rankHeader === b.rankHeader &&
    a.ranks.length === b.ranks.length &&
    a.ranks.every((rank, index) => rank === b.ranks[index])
  );
}

/** Validates an upstream list (creation and `setUpstreams()`). Throws {@link OptionError}. */
export function parseUpstreams(path: string, value: unknown): UpstreamConfig[] {
  if (!Array.isArray(value) || value.length === 0) {
    fail(path, `must be a non-empty array, got ${shown(value)}`, "Pass e.g. `upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 8 }]`.");
  }
  const names = new Set<string>();
  return value.map((upstream, index) => {
    const config = parseUpstream(`${path}[${index}]`, upstream);
    if (names.has(config.name)) {
      fail(`${path}[${index}].name`, `repeats the name '${config.name}'`, 'Give each upstream its own `name`: it labels the metrics.');
    }
    names.add(config.name);
    return config;
  });
}

function parseUpstream(path: string, value: unknown): UpstreamConfig {
  if (!isPlainObject(value)) fail(path, `must be an object, got ${shown(value)}`, "Use e.g. `{ url: 'http://127.0.0.1:8000' }`.");
  rejectUnknownKeys(path, value, UPSTREAM_KEYS);
  if (value.dns !== undefined && value.url !== undefined) {
    fail(path, 'gives both `url` and `dns`', 'Give `url` for one server, or `dns: { name, port }` for every address a name resolves to.');
  }
  const dns = value.dns === undefined ? undefined : parseUpstreamDns(`${path}.dns`, value.dns, value.name);
  if (dns !== undefined && value.kvEvents !== undefined) {
    fail(`${path}.kvEvents`, 'cannot follow the addresses of a `dns` entry', 'Give KV events on upstreams given by `url`, or leave `kvEvents` out.');
  }
  // A DNS entry is a template: each address it resolves to gets its own URL and name.
  const url = dns === undefined ? parseUrl(`${path}.url`, value.url) : new URL(`http://0.0.0.0:${dns.port}`);
  const name = value.name === undefined ? (dns === undefined ? url.origin : dns.name) : value.name;
  // The name travels in metric labels and the decision header: printable ASCII only.
  if (typeof name !== 'string' || !/^[\x20-\x7e]{1,128}$/.test(name)) {
    fail(`${path}.name`, `must be 1 to 128 printable ASCII characters, got ${shown(value.name)}`, "Use e.g. `name: 'node-a'`.");
  }
  const dataParallelSize = integerOption(`${path}.dataParallelSize`, value.dataParallelSize, DATA_PARALLEL_SIZE, 1, MAX_DATA_PARALLEL_SIZE);
  const startRank = integerOption(`${path}.startRank`, value.startRank, START_RANK, 0, MAX_RANK - dataParallelSize + 1);
  const ranks = parseRanks(`${path}.ranks`, value.ranks, startRank, dataParallelSize);
  const kvEvents = parseKvEvents(`${path}.kvEvents`, value.kvEvents, ranks);
  const bootstrapPort = value.bootstrapPort === undefined ? undefined : integerOption(`${path}.bootstrapPort`, value.bootstrapPort, 0, 1, 65_535);
  return {
    name,
    url: url.href.replace(/\/$/, ''),
    startRank,
    dataParallelSize,
    ranks,
    ...(value.ranks !== undefined && { rankList: ranks }),
    rankHeader: oneOf(`${path}.rankHeader`, value.rankHeader, RANK_HEADER_MODES, RANK_HEADER),
    discoverIntervalMs: parseDiscover(`${path}.discover`, value.discover),
    ...(kvEvents !== undefined && { kvEvents }),
    ...(value.models !== undefined && { models: parseModels(`${path}.models`, value.models) }),
    ...(dns !== undefined && { dns }),
    role: oneOf(`${path}.role`, value.role, ROLES, 'both'),
    ...(bootstrapPort !== undefined && { bootstrapPort }),
  };
}
function parseUrl(path: string, value: unknown): URL {
  let url: URL | undefined;
  if (typeof value === 'string') {
    try {
      url = new URL(value);
    } catch {
      url = undefined;
    }
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
    fail(path, `must be an http: or https: URL, got ${shown(typeof value === 'string' ? redactUrl(value) : value)}`, "Use e.g. `url: 'http://127.0.0.1:8000'`.");
  }
  const problem = upstreamUrlProblem(url);
  if (problem) fail(path, problem.problem, problem.fix);
  return url;
}

function parseRanks(path: string, value: unknown, startRank: number, size: number): number[] {
  const last = startRank + size - 1;
  if (value === undefined) return Array.from({ length: size }, (_, offset) => startRank + offset);
  if (!Array.isArray(value) || value.length === 0) {
    fail(path, `must be a non-empty array of global ranks, got ${shown(value)}`, `Use ranks from ${startRank} to ${last}, e.g. \`ranks: [${startRank}]\`, or leave it out.`);
  }
  const ranks = new Set<number>();
  for (const rank of value) {
    if (typeof rank !== 'number' || !Number.isInteger(rank) || rank < startRank || rank > last) {
      fail(path, `holds ${shown(rank)}, which this upstream does not serve`, `It serves global ranks ${startRank} to ${last} (startRank … startRank + dataParallelSize − 1).`);
    }
    if (ranks.has(rank)) fail(path, `lists rank ${rank} twice`, 'List each rank once.');
    ranks.add(rank);
  }
  return [...ranks].sort((a, b) => a - b);
}

/** The prefill pool: what serves the prefill leg. */
export function prefillPool(upstreams: readonly UpstreamConfig[]): UpstreamConfig[] {
  return upstreams.filter((upstream) => upstream.role !== 'decode');
}

/** The decode pool: what serves the decode leg (and every request the router sends whole). */
export function decodePool(upstreams: readonly UpstreamConfig[]): UpstreamConfig[] {
  return upstreams.filter((upstream) => upstream.role !== 'prefill');
}
