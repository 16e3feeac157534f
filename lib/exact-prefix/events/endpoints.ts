/**
 * Where each rank's KV-event publisher (and replay ROUTER) listens. vLLM offsets one
 * configured endpoint by the engine's global data-parallel rank (`offset_endpoint_port` in
 * vllm/distributed/kv_events.py): `tcp://host:P` becomes `tcp://host:P+rank` and
 * `inproc://name` becomes `inproc://name_dp<rank>`; rank 0 keeps the endpoint as given. An
 * array names each served rank's endpoint instead (external load balancing, one engine per
 * server).
 */

/** The endpoint of each of `ranks`, in their order. Throws a TypeError naming `path`. */
export function resolveKvEndpoints(endpoint: string | readonly string[], ranks: readonly number[], path: string): string[] {
  if (Array.isArray(endpoint)) {
    if (endpoint.length !== ranks.length) {
      throw new TypeError(`${path} lists ${endpoint.length} endpoints for ${ranks.length} ranks: give one per served rank, in rank order, or one endpoint that vLLM offsets by rank.`);
    }
    return endpoint.map((one, at) => checkEndpoint(one, `${path}[${at}]`));
  }
  const base = checkEndpoint(endpoint as string, path);
  return ranks.map((rank) => offsetEndpoint(base, rank, path));
}

/** vLLM's `offset_endpoint_port`. */
export function offsetEndpoint(endpoint: string, rank: number, path = 'endpoint'): string {
  if (rank === 0) return endpoint;
  if (endpoint.startsWith('inproc://')) return `${endpoint}_dp${rank}`;
  if (endpoint.startsWith('tcp://')) {
    const colon = endpoint.lastIndexOf(':');
    const port = Number(endpoint.slice(colon + 1)) + rank;
    if (port > 65535) throw new TypeError(`${path}: rank ${rank}'s port ${port} is past 65535; vLLM adds the global rank to the configured port, so choose a lower one.`);
    return `${endpoint.slice(0, colon)}:${port}`;
  }
  throw new TypeError(`${path}: vLLM offsets only tcp:// and inproc:// endpoints by rank; list one endpoint per rank instead.`);
}

function checkEndpoint(endpoint: string, path: string): string {
  if (typeof endpoint !== 'string') throw new TypeError(`${path} must be a ZeroMQ endpoint string such as 'tcp://10.0.0.5:5557'.`);
  const tcp = /^tcp:\/\/([^*\s/]+):([0-9]{1,5})$/.exec(endpoint);
  if (tcp !== null) {
    if (Number(tcp[2]) < 1 || Number(tcp[2]) > 65535) throw new TypeError(`${path}: port ${tcp[2]} is out of range in '${endpoint}'.`);
    return endpoint;
  }
  if (/^(ipc|inproc):\/\/\S+$/.test(endpoint)) return endpoint;
  throw new TypeError(`${path} must name the host vLLM publishes on, such as 'tcp://10.0.0.5:5557' (vLLM binds 'tcp://*:5557'; connect to its address), got '${endpoint}'.`);
}
