import { readFileSync } from 'node:fs';
import { extractPrompt } from '../../lib/request/prompt';
import { exponential, integerBetween, type Rng, shuffle } from './rng';
import { blockHashes, tokensText } from './tokens';

/** One request as the simulator replays it. Timing is in units the load level scales. */
export interface SimRequest {
  readonly id: number;
  /** Open loop: arrival time in units of the mean inter-arrival time. */
  readonly unitArrival: number;
  /** Closed loop: this request is sent `unitThink` after `follows` finishes. */
  readonly follows?: number;
  readonly unitThink: number;
  readonly inputTokens: number;
  readonly outputTokens: number;
  /** Chained hashes of the prompt's full blocks, as the rank's prefix cache keys them. */
  readonly inputBlocks: Int32Array;
  /** Prompt and response blocks: what the rank holds once the request finishes. */
  readonly sequenceBlocks: Int32Array;
  /** The prompt text the router would extract from the body. */
  readonly prompt: string;
  readonly path: string;
  readonly sessionKey: string | undefined;
  /** The previous turn of the same conversation. */
  readonly previousTurn: number | undefined;
  /** Sent by another client straight to this rank, past every gateway. */
  readonly direct?: number;
}

/** A replayable workload and the rank cache size it is run with. */
export interface Workload {
  readonly name: string;
  readonly description: string;
  readonly requests: readonly SimRequest[];
  /** Seconds per time unit at each load level. */
  readonly timeScale: { readonly low: number; readonly high: number };
  /** Per-rank KV cache, in blocks. */
  readonly rankCacheBlocks: number;
}

/** How much work the fleet can do with no cache hits: sets the load levels. */
export interface FleetCapacity {
  readonly ranks: number;
  readonly prefillTokensPerSecond: number;
}

/** Load levels as a fraction of the fleet's no-cache prefill capacity. */
export const LOAD_LEVELS = { low: 0.3, high: 1.0 } as const;

/** Hands out fresh token ids: text that no other part of the workload shares. */
export class TokenSource {
  private next = 1;
  take(count: number): number[] {
    const tokens = new Array<number>(count);
    for (let i = 0; i < count; i++) tokens[i] = this.next++;
    return tokens;
  }
}

export interface RequestShape {
  unitArrival: number;
  follows?: number;
  unitThink?: number;
  input: number[];
  output: number[] | number;
  prompt: string;
  path: string;
  sessionKey?: string;
  previousTurn?: number;
  direct?: number;
}

/** A request with its block hashes, from its tokens. */
export function buildRequest(id: number, shape: RequestShape): SimRequest {
  const output = shape.output;
  const outputTokens = typeof output === 'number' ? output : output.length;
  // A response is cached too, but only the part a later prompt can repeat is known.
  const sequence = typeof output === 'number' ? shape.input : shape.input.concat(output);
  return {
    id,
    unitArrival: shape.unitArrival,
    follows: shape.follows,
    unitThink: shape.unitThink ?? 0,
    inputTokens: shape.input.length,
    outputTokens,
    inputBlocks: blockHashes(shape.input),
    sequenceBlocks: blockHashes(sequence),
    prompt: shape.prompt,
    path: shape.path,
    sessionKey: shape.sessionKey,
    previousTurn: shape.previousTurn,
    direct: shape.direct,
  };
}

/** The aggregate KV cache equals the workload's distinct prompt blocks: a router that keeps
 * each prefix on one rank can hold everything; one that copies prefixes everywhere cannot. */
export function rankCacheFor(requests: readonly SimRequest[], ranks: number): number {
  const distinct = new Set<number>();
  for (const request of requests) for (const block of request.inputBlocks) distinct.add(block);
  return Math.ceil(distinct.size / ranks);
}

function openLoopScale(requests: readonly SimRequest[], capacity: FleetCapacity): Workload['timeScale'] {
  const meanInput = requests.reduce((sum, r) => sum + r.inputTokens, 0) / requests.length;
  const noCacheRate = (capacity.ranks * capacity.prefillTokensPerSecond) / meanInput;
  return { low: 1 / (LOAD_LEVELS.low * noCacheRate), high: 1 / (LOAD_LEVELS.high * noCacheRate) };
}

/** Options of {@link sharedPrefixWorkload}; the defaults are SGLang's `generated-shared-prefix`. */
export interface SharedPrefixShape {
  groups: number;
  promptsPerGroup: number;
  systemTokens: number;
  questionTokens: number;
  outputTokens: number;
}

/** SGLang's generated-shared-prefix benchmark: groups sharing a long system prompt, shuffled, Poisson arrivals. */
export function sharedPrefixWorkload(rng: Rng, capacity: FleetCapacity, shape: SharedPrefixShape): Workload {
  const tokens = new TokenSource();
  const prompts: Array<{ input: number[] }> = [];
  for (let group = 0; group < shape.groups; group++) {
    const system = tokens.take(shape.systemTokens);
    for (let i = 0; i < shape.promptsPerGroup; i++) prompts.push({ input: system.concat(tokens.take(shape.questionTokens)) });
  }
  shuffle(rng, prompts);
  let clock = 0;
  const requests = prompts.map(({ input }, id) => {
    clock += exponential(rng, 1);
    return buildRequest(id, {
      unitArrival: clock,
      input,
      output: shape.outputTokens,
      prompt: tokensText(input),
      path: '/v1/completions',
    });
  });
  return {
    name: 'shared-prefix',
    description: `${shape.groups} groups × ${shape.promptsPerGroup} prompts, ${shape.systemTokens}-token system prompt, ${shape.questionTokens}-token question`,
    requests,
    timeScale: openLoopScale(requests, capacity),
    rankCacheBlocks: rankCacheFor(requests, capacity.ranks),
  };
}

/** Options of {@link multiTurnWorkload}. */
export interface MultiTurnShape {
  conversations: number;
  minTurns: number;
  maxTurns: number;
  commonPrefixTokens: number;
}

/**
 * Chat sessions, closed loop: a turn is sent after the previous answer plus think time, and
 * its prompt is the whole history. Bodies are real `messages` arrays run through the
 * router's own prompt extraction.
 */
export function multiTurnWorkload(rng: Rng, capacity: FleetCapacity, shape: MultiTurnShape): Workload {
  const tokens = new TokenSource();
  const system = tokens.take(shape.commonPrefixTokens);
  const requests: SimRequest[] = [];
  let start = 0;
  for (let conversation = 0; conversation < shape.conversations; conversation++) {
    start += exponential(rng, 1);
    const turns = integerBetween(rng, shape.minTurns, shape.maxTurns);
    const messages: Array<{ role: string; content: string }> = [{ role: 'system', content: tokensText(system) }];
    let history = system;
    let previous: number | undefined;
    for (let turn = 0; turn < turns; turn++) {
      const user = tokens.take(integerBetween(rng, 40, 160));
      const answer = tokens.take(integerBetween(rng, 80, 320));
      messages.push({ role: 'user', content: tokensText(user) });
      const input = history.concat(user);
      const id = requests.length;
      requests.push(
        buildRequest(id, {
          unitArrival: start,
          follows: previous,
          unitThink: previous === undefined ? 0 : exponential(rng, 1),
          input,
          output: answer,
          prompt: extractPrompt({ model: 'm', messages }) ?? '',
          path: '/v1/chat/completions',
          sessionKey: `conversation-${conversation}`,
          previousTurn: previous,
        }),
      );
      messages.push({ role: 'assistant', content: tokensText(answer) });
      history = input.concat(answer);
      previous = id;
    }
  }
  return {
    name: 'multi-turn',
    description: `${shape.conversations} conversations × ${shape.minTurns}–${shape.maxTurns} turns, ${shape.commonPrefixTokens}-token common prefix`,
    requests,
    // Seconds per unit of think time and of gap between conversation starts.
    timeScale: { low: 20, high: 1 },
    rankCacheBlocks: rankCacheFor(requests, capacity.ranks),
  };
}

/** One line of a Mooncake trace (FAST '25): `hash_ids` name 512-token blocks, chained. */
export interface MooncakeRecord {
  timestamp: number;
  input_length: number;
  output_length: number;
  hash_ids: number[];
}

/** Tokens per `hash_ids` entry in Mooncake's traces. */
export const MOONCAKE_BLOCK_TOKENS = 512;

/** Parses Mooncake-format JSONL; rejects lines without the four fields. */
export function parseMooncakeTrace(text: string): MooncakeRecord[] {
  const records: MooncakeRecord[] = [];
  for (const [index, line] of text.split('\n').entries()) {
    if (line.trim() === '') continue;
    const record = JSON.parse(line) as Partial<MooncakeRecord>;
    const valid =
      typeof record.timestamp === 'number' &&
      Number.isInteger(record.input_length) &&
      Number.isInteger(record.output_length) &&
      Array.isArray(record.hash_ids) &&
      record.hash_ids.every((id) => Number.isInteger(id));
    if (!valid) throw new Error(`Mooncake trace line ${index + 1}: needs timestamp, input_length, output_length, hash_ids`);
    records.push(record as MooncakeRecord);
  }
  return records;
}

/** Replays a Mooncake trace; equal `hash_ids` at equal positions become equal token blocks. */
export function mooncakeWorkload(path: string, capacity: FleetCapacity, limit = Infinity): Workload {
  const records = parseMooncakeTrace(readFileSync(path, 'utf8')).slice(0, limit);
  const first = records[0]?.timestamp ?? 0;
  const span = (records[records.length - 1]?.timestamp ?? first) - first;
  const meanGap = records.length > 1 && span > 0 ? span / (records.length - 1) : 1;
  const requests = records.map((record, id) => {
    const input: number[] = [];
    for (const hashId of record.hash_ids) {
      for (let t = 0; t < MOONCAKE_BLOCK_TOKENS && input.length < record.input_length; t++) {
        input.push(hashId * MOONCAKE_BLOCK_TOKENS + t + 1);
      }
    }
    return buildRequest(id, {
      unitArrival: (record.timestamp - first) / meanGap,
      input,
      output: record.output_length,
      prompt: tokensText(input),
      path: '/v1/completions',
    });
  });
  return {
    name: 'mooncake',
    description: `${requests.length} requests from ${path.split('/').pop()}`,
    requests,
    timeScale: openLoopScale(requests, capacity),
    rankCacheBlocks: rankCacheFor(requests, capacity.ranks),
  };
}

/** A synthetic trace in Mooncake's format: Zipf-popular shared documents plus unique suffixes. */
export function generateMooncakeTrace(rng: Rng, count: number): MooncakeRecord[] {
  const documents = Array.from({ length: 24 }, (_, d) =>
    Array.from({ length: integerBetween(rng, 2, 10) }, (__, b) => 1 + d * 100 + b),
  );
  const weights = documents.map((_, d) => 1 / Math.pow(d + 1, 1.1));
  const totalWeight = weights.reduce((a, b) => a + b, 0);
  let nextUnique = 100_000;
  let timestamp = 0;
  const records: MooncakeRecord[] = [];
  for (let i = 0; i < count; i++) {
    let pick = rng() * totalWeight;
    let document = 0;
    while (pick > weights[document] && document < documents.length - 1) pick -= weights[document++];
    const shared = documents[document].slice(0, integerBetween(rng, 1, documents[document].length));
    const hashIds = shared.concat(Array.from({ length: integerBetween(rng, 0, 2) }, () => nextUnique++));
    const inputLength = hashIds.length * MOONCAKE_BLOCK_TOKENS - integerBetween(rng, 0, MOONCAKE_BLOCK_TOKENS - 1);
    timestamp += Math.round(exponential(rng, 500));
    records.push({ timestamp, input_length: inputLength, output_length: integerBetween(rng, 20, 400), hash_ids: hashIds });
  }
  return records;
}


/** Options of {@link multiTenantWorkload}. */
export interface MultiTenantShape {
  tenants: number;
  requests: number;
  systemTokens: number;
  questionTokens: number;
  outputTokens: number;
  /** Zipf exponent of the tenants' popularity. */
  zipf: number;
}

/**
 * Many tenants' system prompts with Zipf popularity, Poisson arrivals, and a cache of half the
 * distinct blocks: the engines evict rare tenants' prompts that a router's index may still
 * believe cached.
 */
export function multiTenantWorkload(rng: Rng, capacity: FleetCapacity, shape: MultiTenantShape): Workload {
  const tokens = new TokenSource();
  const systems = Array.from({ length: shape.tenants }, () => tokens.take(shape.systemTokens));
  const weights = systems.map((_, i) => 1 / Math.pow(i + 1, shape.zipf));
  const total = weights.reduce((a, b) => a + b, 0);
  let clock = 0;
  const requests = Array.from({ length: shape.requests }, (_, id) => {
    let pick = rng() * total;
    let tenant = 0;
    while (pick > weights[tenant] && tenant < shape.tenants - 1) pick -= weights[tenant++];
    clock += exponential(rng, 1);
    const input = systems[tenant].concat(tokens.take(shape.questionTokens));
    return buildRequest(id, { unitArrival: clock, input, output: shape.outputTokens, prompt: tokensText(input), path: '/v1/completions' });
  });
  return {
    name: 'multi-tenant',
    description: `${shape.tenants} tenants' ${shape.systemTokens}-token system prompts, Zipf(${shape.zipf}) popularity, ${shape.questionTokens}-token question, cache at half the distinct blocks`,
    requests,
    timeScale: openLoopScale(requests, capacity),
    rankCacheBlocks: Math.ceil(rankCacheFor(requests, capacity.ranks) / 2),
  };
}
