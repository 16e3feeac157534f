/**
 * The exact prefix machinery of one router: per upstream with `kvEvents`, a subscription to
 * its ranks' KV-event streams feeding an exact index; one tokenizer for the router; one
 * tokenizer-agreement sampler per upstream; the metrics of all of it.
 *
 * Per pick, a rank is scored on the exact index only while it can be trusted:
 *
 * - **its stream is fresh**: its SUB socket is connected (zeromq's socket events, with ZMTP
 *   heartbeats for a peer that vanished without closing) and its index was rebuilt from the
 *   replay buffer since it connected (subscriber.ts), and no request routed to it with new
 *   blocks to store has gone `confirmAfterMs` without a stored event from it since. An idle
 *   engine publishes nothing and stays fresh; a publisher that stopped publishing but keeps
 *   its connection goes stale at the first request routed there with new blocks;
 * - **the tokenizer agrees**: a sampled request whose tokens differ from the upstream's
 *   `/tokenize` is a suspicion (lib/verdicts); once the router's own samples differ too, or
 *   samples from `verdicts.minSources` distinct sources do, the upstream's ranks are routed on
 *   the approximate index until the router restarts (the files or the template differ, and more
 *   samples will not fix that).
 *
 * Other ranks are scored on the approximate index, in the same pick. A routed request's blocks
 * count on its rank at once, as speculative entries, until its events confirm them or
 * `speculativeMs` passes: a burst of requests sharing a new prefix would otherwise scatter
 * before the first event arrives.
 */
import type { Registry } from 'prom-client';
import type { Endpoint } from '../types';
import { KvExactIndex, type BlockKeys } from './index/exact-index';
import { ExactPick, type ExactLookup } from '../policies/exact-pick';
import { PromptKeysMemo } from './index/prompt-keys-memo';
import type { KvEventsOptions } from './events/source';
import { createKvEventSubscriber, type KvEventSubscriber } from './events/subscriber';
import { PromptTokenizer, type PromptKind } from './tokenizer/tokenizer';
import { TokenizerAgreement } from './tokenizer/tokenizer-agreement';
import { createKvMetrics, type KvGaugeReport } from './kv-metrics';
import { partsOf } from './tokenizer/id-parts';
import type { ExactGate, ExactReceipts } from '../policies/pick-ticket';
import { unmodelled } from '../verdicts/modelled';
import { quietVerdicts, Suspicion, type Verdicts } from '../verdicts/verdicts';
import { CUT_SAMPLES, SAMPLE_MESSAGES } from './tokenizer/tokenizer-samples';

export { ExactPick, type ExactLookup, type IndexSource } from '../policies/exact-pick';

/** An upstream as exact routing needs it. */
export interface ExactUpstream {
  readonly name: string;
  readonly url: string;
  /** The global ranks routed to. */
  readonly ranks: readonly number[];
  /** Absent: the upstream is routed on the approximate index only. */
  readonly kvEvents?: KvEventsOptions;
}

/** Options of {@link createExactRouting}. */
export interface ExactRoutingOptions {
  upstreams: readonly ExactUpstream[];
  /** The model's tokenizer: a directory (or file) path, both files' paths, or a loaded one. */
  tokenizer: string | readonly [string, string] | PromptTokenizer;
  /** Where the metrics go; none without. */
  metrics?: { registry: Registry; prefix: string };
  /** How long a request routed to a rank may wait for any batch from it before the rank is stale. Default: 10,000 ms. */
  confirmAfterMs?: number;
  /** How long a routed request's blocks count on its rank without an event confirming them. Default: 5,000 ms. */
  speculativeMs?: number;
  /** Share of requests whose tokens are checked against the upstream's `/tokenize`, after the first. Default: 0.01. */
  agreementSampleRate?: number;
  /** Least time between two agreement checks of an upstream. Default: 1,000 ms. */
  agreementIntervalMs?: number;
  /**
   * Whether a request's `model` names a LoRA adapter (the router's model pools know those their
   * upstreams' `/v1/models` list): its blocks are keyed under the adapter even before an event
   * named it, so it is not scored against the base model's. Default: adapters events named only.
   */
  isAdapter?: (model: string) => boolean;
  /** Told once per kind of trouble (a disagreeing tokenizer, a failing stream). */
  warn?: (message: string) => void;
  /** Route receipts: each upstream is routed through its gate, its stored blocks told, each exact pick ticketed. */
  receipts?: ExactReceipts;
  /** What a block in a lower tier is worth against a GPU hit, by medium (`prefixAware.tierWeights`). Default: none scored. */
  tierWeights?: Readonly<Record<string, number>>;
  /** Where a tokenizer verdict is taken (lib/verdicts). Default: one of its own, `minSources` 3, unreported. */
  verdicts?: Verdicts;
  /** The clock. Default: `Date.now`. */
  now?: () => number;
}

/** A router's exact routing. */
export interface ExactRouting extends ExactLookup {
  /**
   * Tokenizes the request (`chat` or `completions`, by its path) and looks its first prompt
   * up for every candidate; `undefined` when no candidate is served by a fresh, agreeing
   * exact index or the prompt cannot be tokenized (then the pick is approximate throughout).
   */
  lookup(kind: PromptKind, body: Record<string, unknown>, candidates: readonly Endpoint[], from?: () => string): ExactPick | undefined;
  /** Whether `upstream`'s `rank` is scored on the exact index now. */
  serves(upstream: string, rank: number): boolean;
  /** Follows a change of upstreams: streams of removed or changed upstreams stop, new ones start. */
  reconfigure(upstreams: readonly ExactUpstream[]): void;
  /** Stops every socket and timer. */
  close(): Promise<void>;
}

/** One upstream's stream, index and agreement. */
interface UpstreamStream {
  readonly upstream: ExactUpstream;
  readonly signature: string;
  readonly index: KvExactIndex;
  /** The last prompt's block keys, which the next prompt takes up as far as it starts alike. */
  readonly memo: PromptKeysMemo;
  readonly subscriber: KvEventSubscriber;
  readonly agreement: TokenizerAgreement;
  /** The tokenizer verdict (lib/verdicts): its ranks are routed on the approximate index until the router restarts. */
  distrusted: boolean;
  /** Per rank: when the oldest request still waiting for a batch was routed (absent: none). */
  readonly awaiting: Map<number, number>;
  readonly labels: Map<number, { upstream: string; rank: string }>;
  /** With route receipts: whether they let the upstream be scored on the exact index, and where its picks' tickets come from. */
  readonly gate: ExactGate | undefined;
}

/** Starts the subscriptions of every upstream with `kvEvents`; throws on a wrong endpoint or a missing package. */
export function createExactRouting(options: ExactRoutingOptions): ExactRouting {
  const tokenizer = options.tokenizer instanceof PromptTokenizer ? options.tokenizer : PromptTokenizer.load(options.tokenizer);
  const now = options.now ?? Date.now;
  const confirmAfterMs = options.confirmAfterMs ?? 10_000;
  const speculativeMs = options.speculativeMs ?? 5_000;
  const warned = new Set<string>();
  const warnOnce = (kind: string, message: string) => {
    if (warned.has(kind)) return;
    warned.add(kind);
    options.warn?.(message);
  };
  const verdicts = options.verdicts ?? quietVerdicts();
  /** The router's own samples, tokenized here: `/tokenize` disagreeing on one of them confirms a disagreement. */
  async function confirmDisagreement(agreement: TokenizerAgreement): Promise<boolean | undefined> {
    const samples: Array<[PromptKind, Record<string, unknown>]> = [['completions', { prompt: CUT_SAMPLES.join(' ') }]];
    if (tokenizer.hasChatTemplate) samples.push(['chat', { messages: SAMPLE_MESSAGES }]);
    let answered = false;
    for (const [kind, body] of samples) {
      const outcome = tokenizer.tokenize(kind, body);
      if (!('prompts' in outcome)) continue;
      const agreed = await agreement.confirm(kind, body, outcome.prompts[0]);
      if (agreed === false) return true;
      if (agreed === true) answered = true;
    }
    return answered ? false : undefined;
  }
  const metrics = options.metrics ? createKvMetrics(options.metrics.registry, options.metrics.prefix) : undefined;
  const streams = new Map<string, UpstreamStream>();
  let closed = false;

  function start(upstream: ExactUpstream): UpstreamStream {
    const events = upstream.kvEvents!;
    const index = new KvExactIndex({ ranks: upstream.ranks, tierWeights: options.tierWeights });
    const gate = options.receipts?.follow(upstream.name, index);
    index.observer = gate;
    const awaiting = new Map<number, number>();
    const labels = new Map(upstream.ranks.map((rank) => [rank, { upstream: upstream.name, rank: String(rank) }]));
    // A sample that disagrees is a suspicion: the router's own samples confirm it, or samples
    // of `verdicts.minSources` distinct sources (lib/verdicts); until then exact routing stays.
    const suspicion = new Suspicion();
    let confirming = false;
    const agreement = new TokenizerAgreement({
      url: upstream.url,
      sampleRate: options.agreementSampleRate,
      minIntervalMs: options.agreementIntervalMs,
      onResult: (result) => {
        if (result.agreed || stream.distrusted) return;
        suspicion.add(result.source ?? '');
        if (confirming) return;
        confirming = true;
        const { at, routerCount, upstreamCount } = result.difference!;
        void confirmDisagreement(agreement).then((confirmed) => {
          confirming = false;
          if (stream.distrusted || streams.get(upstream.name) !== stream) return;
          const evidence = { at, routerCount, upstreamCount, sources: suspicion.sources, probe: confirmed === undefined ? 'unknown' : confirmed ? 'disagrees' : 'agrees' };
          // Its own samples may agree where a client's text finds a real difference: then the sources decide.
          if (confirmed !== true && !verdicts.enough(suspicion.sources)) {
            verdicts.refused(upstream.name, 'tokenizer', evidence);
            return;
          }
          stream.distrusted = true;
          verdicts.taken(upstream.name, 'tokenizer', confirmed === true ? 'probe' : 'sources', evidence);
          warnOnce(
            `agreement:${upstream.name}`,
            `express-dp-router: the tokenizer disagrees with upstream '${upstream.name}'s /tokenize (first difference at token ${at}; ${routerCount} tokens here, ${upstreamCount} there): its ranks are routed on the approximate prefix index. Point prefixAware.tokenizer at the files the engine serves (tokenizer.json and tokenizer_config.json with its chat template).`,
          );
        });
      },
    });
    const subscriber = createKvEventSubscriber({
      upstream: upstream.name,
      ranks: upstream.ranks,
      endpoint: events.endpoint,
      replayEndpoint: events.replayEndpoint,
      topic: events.topic,
      sink: index,
      listener: {
        event(rank, type, count) {
          // New blocks from the rank answer every request routed there before them; an
          // invalid batch or a removal does not (a publisher sending garbage is not following).
          if (type === 'stored') awaiting.delete(rank);
          metrics?.events.inc({ ...labels.get(rank)!, type }, count);
        },
        gap(rank, outcome) {
          metrics?.gaps.inc({ ...labels.get(rank)!, outcome });
        },
        error(rank, error) {
          warnOnce(`error:${upstream.name}`, `express-dp-router: handling KV events of upstream '${upstream.name}' rank ${rank} failed: ${String(error)}`);
        },
      },
    });
    const stream: UpstreamStream = { upstream, signature: signatureOf(upstream), index, memo: new PromptKeysMemo(), subscriber, agreement, distrusted: false, awaiting, labels, gate };
    metrics?.track(stream);
    return stream;
  }

  function stop(stream: UpstreamStream): Promise<void> {
    stream.agreement.close();
    metrics?.forget(stream);
    return stream.subscriber.close();
  }

  function serving(stream: UpstreamStream, rank: number): boolean {
    if (!stream.subscriber.isFresh(rank) || stream.distrusted || (stream.gate !== undefined && !stream.gate.exact)) return false;
    const since = stream.awaiting.get(rank);
    return since === undefined || now() - since <= confirmAfterMs;
  }

  function reconfigure(upstreams: readonly ExactUpstream[]): void {
    const wanted = new Map(upstreams.filter((upstream) => upstream.kvEvents !== undefined).map((upstream) => [upstream.name, upstream]));
    for (const [name, stream] of streams) {
      const next = wanted.get(name);
      if (next !== undefined && signatureOf(next) === stream.signature) continue;
      streams.delete(name);
      void stop(stream);
    }
    for (const [name, upstream] of wanted) {
      if (streams.has(name)) continue;
      try {
        streams.set(name, start(upstream));
      } catch (error) {
        // At creation the router fails; later (discovered ranks that no longer fit an endpoint
        // list) the upstream is routed approximately.
        if (!running) throw error;
        warnOnce(`start:${name}`, `express-dp-router: KV events of upstream '${name}' cannot be subscribed to (${(error as Error).message}); its ranks are routed on the approximate prefix index.`);
      }
    }
  }

  let running = false;
  reconfigure(options.upstreams);
  running = true;
  if (metrics !== undefined) metrics.sources.add(collect);

  function collect(report: KvGaugeReport): void {
    for (const stream of streams.values()) {
      for (const [rank, labels] of stream.labels) {
        report.rank(labels, stream.index.blockCount(rank), serving(stream, rank));
        for (const [medium, blocks] of stream.index.tiers.counts(stream.index.positionOf(rank))) report.tier(labels, medium, blocks);
      }
      report.agreement(stream.agreement.compared, stream.agreement.ratio);
    }
  }

  function lookup(kind: PromptKind, body: Record<string, unknown>, candidates: readonly Endpoint[], from?: () => string): ExactPick | undefined {
    let any = false;
    for (const candidate of candidates) {
      const stream = streams.get(candidate.upstream);
      if (stream !== undefined && serving(stream, candidate.rank)) {
        any = true;
        break;
      }
    }
    if (!any) return undefined;
    const outcome = tokenizer.tokenize(kind, body);
    if (!('prompts' in outcome)) return undefined;
    const tokens = outcome.prompts[0];
    // A LoRA request is scored under its adapter, as the index stores its blocks (vLLM's
    // `model` names the adapter); a name neither an event nor the model pools know is scored as
    // the base model.
    const model = typeof body.model === 'string' ? body.model : undefined;
    // vLLM keys a salted prompt's first block with the salt (a non-empty string, else it answers 400).
    const salt = typeof body.cache_salt === 'string' && body.cache_salt !== '' ? body.cache_salt : undefined;
    // What the router does not model exactly is routed, but judges nothing (lib/verdicts).
    const evidence = unmodelled(kind, body, true) === undefined;
    const adapterIn = (stream: UpstreamStream) => (model !== undefined && (stream.index.isAdapter(model) || options.isAdapter?.(model) === true) ? model : undefined);
    const matched = new Int32Array(candidates.length).fill(-1);
    let [tiered, reached]: [Float64Array | undefined, Int32Array | undefined] = [undefined, undefined];
    let promptBlocks = 0;
    // One lookup per upstream, shared by its candidates; its block keys kept for the speculation.
    const found = new Map<UpstreamStream, Int32Array>();
    const weighted = new Map<UpstreamStream, { tiered: Float64Array; reached: Int32Array } | undefined>();
    const keysOf = new Map<UpstreamStream, BlockKeys>();
    for (let at = 0; at < candidates.length; at++) {
      const candidate = candidates[at];
      const stream = streams.get(candidate.upstream);
      if (stream === undefined || !serving(stream, candidate.rank)) continue;
      let blocks = found.get(stream);
      if (blocks === undefined) {
        const loraName = adapterIn(stream);
        const keys = stream.memo.keysFor(tokens, partsOf(tokens));
        keysOf.set(stream, keys);
        const match = stream.index.match(tokens, { now: now(), loraName, salt, keys });
        if (match.promptBlocks === 0) continue;
        blocks = match.matchedBlocks;
        // Upstreams with another block size are counted in the first one's blocks.
        if (promptBlocks === 0) promptBlocks = match.promptBlocks;
        else if (match.promptBlocks !== promptBlocks) blocks = blocks.map((held) => Math.floor((held * promptBlocks) / match.promptBlocks));
        found.set(stream, blocks);
        weighted.set(stream, match.weightedBlocks && { tiered: match.weightedBlocks.map((held) => (held * promptBlocks) / match.promptBlocks), reached: match.reachedBlocks!.map((held) => Math.floor((held * promptBlocks) / match.promptBlocks)) });
      }
      const position = stream.index.positionOf(candidate.rank);
      matched[at] = blocks[position];
      const tiers = weighted.get(stream);
      if (tiers !== undefined) [(tiered ??= new Float64Array(candidates.length).fill(NaN))[at], (reached ??= new Int32Array(candidates.length))[at]] = [tiers.tiered[position], tiers.reached[position]];
    }
    // Where no lower tier counts, the GPU's blocks (−1: approximate).
    if (tiered !== undefined) for (let at = 0; at < candidates.length; at++) if (Number.isNaN(tiered[at])) [tiered[at], reached![at]] = [matched[at], matched[at]];
    if (promptBlocks === 0) return undefined;
    const pick: ExactPick = new ExactPick(promptBlocks, matched, (at) => {
      const chosen = candidates[at];
      const stream = streams.get(chosen.upstream)!;
      const time = now();
      const loraName = adapterIn(stream);
      const keys = keysOf.get(stream);
      stream.index.speculate(chosen.rank, tokens, time + speculativeMs, { loraName, salt, keys });
      if (matched[at] < promptBlocks && !stream.awaiting.has(chosen.rank)) stream.awaiting.set(chosen.rank, time);
      if (!evidence) return;
      stream.agreement.offer(kind, body, tokens, from);
      // Blocks are counted in the first upstream's size: a receipt needs the chosen one's own.
      if (stream.gate !== undefined && keys !== undefined && keys.size === stream.index.blockSize && Math.floor(tokens.length / keys.size) === promptBlocks) {
        pick.ticket = stream.gate.chose({
          rank: chosen.rank,
          path: kind,
          tokens: tokens.length,
          prompts: outcome.prompts.length,
          promptBlocks,
          blockSize: keys.size,
          matched: matched[at],
          lastKey: keys.values.length >= promptBlocks ? keys.values[promptBlocks - 1] : NaN,
          heldElsewhere: heldElsewhere(candidates, matched, at, promptBlocks),
        });
        pick.ticket.source = from?.();
      }
    }, tiered, reached);
    return pick;
  }

  return {
    lookup,
    lookupRequest(path, bytes, candidates, decoded, from) {
      const kind = promptKindOf(path);
      if (kind === undefined) return undefined;
      // The router decoded small bodies whole already; only a scanned one is decoded here.
      if (decoded !== undefined) return lookup(kind, decoded as Record<string, unknown>, candidates, from);
      let body: unknown;
      try {
        body = JSON.parse(bytes.toString('utf8'));
      } catch {
        return undefined;
      }
      if (typeof body !== 'object' || body === null || Array.isArray(body)) return undefined;
      return lookup(kind, body as Record<string, unknown>, candidates, from);
    },
    serves(upstream, rank) {
      const stream = streams.get(upstream);
      return stream !== undefined && serving(stream, rank);
    },
    reconfigure,
    async close() {
      if (closed) return;
      closed = true;
      metrics?.sources.delete(collect);
      const stopping = [...streams.values()].map(stop);
      streams.clear();
      await Promise.all(stopping);
    },
  };
}

/** Whether another candidate of the chosen one's upstream holds the whole prompt. */
function heldElsewhere(candidates: readonly Endpoint[], matched: Int32Array, at: number, promptBlocks: number): boolean {
  const upstream = candidates[at].upstream;
  for (let c = 0; c < candidates.length; c++) if (c !== at && matched[c] >= promptBlocks && candidates[c].upstream === upstream) return true;
  return false;
}

/** The prompt kind of an OpenAI endpoint's path (mount path and query allowed), or `undefined` for one whose prompt is not tokenized. */
export function promptKindOf(path: string): PromptKind | undefined {
  const query = path.indexOf('?');
  const bare = query === -1 ? path : path.slice(0, query);
  if (bare.endsWith('/v1/chat/completions')) return 'chat';
  if (bare.endsWith('/v1/completions')) return 'completions';
  return undefined;
}

/** What identifies an upstream's subscription: a change restarts it. */
function signatureOf(upstream: ExactUpstream): string {
  return JSON.stringify([upstream.url, upstream.ranks, upstream.kvEvents]);
}
