/**
 * The `kvEvents` option of an upstream, in a module of its own: the public option types reach
 * it, and nothing here imports the optional packages' types.
 */

/** Where an upstream's engines publish KV events (`upstreams[].kvEvents`). */
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

/** The model's tokenizer files (`prefixAware.tokenizer`): a directory or `tokenizer.json`, or both files' paths. */
export type TokenizerSource = string | readonly [tokenizerJson: string, tokenizerConfigJson: string];
