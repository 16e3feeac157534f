/** What the preference reads of an endpoint: its load, as policies see it. */
export interface LoadedEndpoint {
  readonly load: number;
}

/**
 * vLLM's `vllm:lora_requests_info` names the adapters running, but with no `engine` label: with
 * data parallelism it cannot say which rank holds which adapter. So the router keeps its own
 * memory: the adapters it sent to each endpoint, most recent first, at most `max_lora` of them
 * (as the engine's GPU slots hold), and it prefers the endpoints whose memory holds the
 * request's adapter — unless they are busier than the least loaded candidate by more than
 * `slack` requests, where waiting would cost more than loading the adapter. A cold adapter
 * prefers endpoints with a free slot, so that it evicts none. With several gateway replicas
 * each remembers only its own traffic.
 */
export class LoraPreference<E extends LoadedEndpoint> {
  private readonly held = new Map<E, string[]>();

  /** `maxLoraOf` says how many adapters an endpoint's engine holds at once (vLLM's `--max-loras`). */
  constructor(
    private readonly maxLoraOf: (endpoint: E) => number,
    private readonly slack = LORA_SLACK,
  ) {}

  /** The candidates to pick among for a request of `adapter`: those holding it (or with room), or all. */
  prefer(adapter: string, candidates: readonly E[]): readonly E[] {
    if (candidates.length < 2) return candidates;
    let least = Infinity;
    for (const endpoint of candidates) if (endpoint.load < least) least = endpoint.load;
    const bound = least + this.slack;
    const holding = candidates.filter((endpoint) => endpoint.load <= bound && this.held.get(endpoint)?.includes(adapter) === true);
    if (holding.length > 0) return holding;
    const roomy = candidates.filter((endpoint) => endpoint.load <= bound && (this.held.get(endpoint)?.length ?? 0) < this.maxLoraOf(endpoint));
    return roomy.length > 0 ? roomy : candidates;
  }

  /** A request of `adapter` was sent to `endpoint`: it holds the adapter now, the least recent one beyond `max_lora` evicted. */
  sent(adapter: string, endpoint: E): void {
    let list = this.held.get(endpoint);
    if (list === undefined) {
      list = [];
      this.held.set(endpoint, list);
    }
    const at = list.indexOf(adapter);
    if (at === 0) return;
    if (at > 0) list.splice(at, 1);
    list.unshift(adapter);
    const max = Math.max(1, this.maxLoraOf(endpoint));
    if (list.length > max) list.length = max;
  }

  /** What the router remembers of an endpoint, most recent first. */
  heldBy(endpoint: E): readonly string[] {
    return this.held.get(endpoint) ?? [];
  }

  /** Forgets endpoints that left. */
  forget(endpoints: Iterable<E>): void {
    for (const endpoint of endpoints) this.held.delete(endpoint);
  }
}

/** Requests of extra load an endpoint holding the adapter may carry over the least loaded one and still be preferred. */
export const LORA_SLACK = 2;
/** vLLM's default `--max-loras`: what an engine holds when its `/metrics` has not said. */
export const DEFAULT_MAX_LORA = 1;
