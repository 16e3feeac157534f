import type { ServerResponse } from 'node:http';
import type { MockEngine, RankState } from './engine';
import { dieAfterFlush, sendJson, SSE_HEADERS } from './http';
import { completionBody, SseStream, type Generation, type GenerationRequest } from './openai';
import type { PdAdmission } from './pd-roles';
import type { MockAdapter } from './prefix-cache';
import type { MockScheduler } from './scheduler';

/** One generation request served by the timed engine, and what its answer needs. */
export interface TimedGeneration {
  readonly scheduler: MockScheduler;
  readonly engine: MockEngine;
  readonly rank: RankState;
  readonly request: GenerationRequest;
  readonly adapter: MockAdapter | undefined;
  /** The request's `cache_salt`, which vLLM folds into its first block's hash. */
  readonly cacheSalt: string | undefined;
  readonly model: string;
  readonly reportsCached: boolean;
  readonly leg: PdAdmission | undefined;
  /** The `eos` fault: a whole answer's `finish_reason` is "stop" (streams are left as the untimed mock leaves them). */
  readonly eos: boolean;
  /** SSE events to write before the connection dies (`die-mid-stream`); `Infinity` without it. */
  readonly eventBudget: number;
  readonly res: ServerResponse;
}

/**
 * Queues a request on its rank's scheduler: its prompt meets the caches when it is first
 * scheduled, and a stream gets one chunk per output token as each step that samples one ends.
 * A stream's headers leave at once, as vLLM's behind uvicorn do.
 */
export function serveTimed(timed: TimedGeneration): void {
  const { engine, rank, request, res, leg } = timed;
  const rankHeader = { 'x-mock-rank': String(rank.globalRank) };
  if (request.stream) {
    res.writeHead(200, { ...SSE_HEADERS, ...rankHeader });
    res.flushHeaders();
    if (timed.eventBudget <= 0) return dieAfterFlush(res);
  }
  let generation: Generation | undefined;
  let stream: SseStream | undefined;
  let admitted = false;
  let eventsWritten = 0;
  const job = timed.scheduler.submit(engine.ranks.indexOf(rank), {
    outputTokens: request.maxTokens,
    admit: () => {
      admitted = true;
      const admission = engine.admit(rank, request.prompts, request.tokenIds, timed.adapter, timed.cacheSalt);
      // The decode of a transfer read the prompt's KV cache from the prefill: nothing left to compute.
      const transferred = leg?.kind === 'decode';
      const cachedTokens = transferred ? admission.promptTokens : admission.cachedTokens + admission.cpuCachedTokens;
      generation = { request, model: timed.model, rank: rank.globalRank, promptTokens: admission.promptTokens, cachedTokens, reportsCached: timed.reportsCached };
      if (request.stream) stream = new SseStream(generation);
      return { promptTokens: admission.promptTokens, cachedTokens: transferred ? admission.promptTokens : admission.cachedTokens, cpuCachedTokens: transferred ? 0 : admission.cpuCachedTokens };
    },
    onToken: (index) => {
      if (res.destroyed || generation === undefined) return;
      const last = index === request.maxTokens - 1;
      if (index === 0 && leg?.kind === 'prefill') leg.commit();
      if (stream === undefined) {
        if (last) sendJson(res, 200, answerBody(generation, timed), rankHeader);
        return;
      }
      res.cork();
      for (const event of stream.eventsAt(index)) {
        if (eventsWritten === timed.eventBudget) {
          res.uncork();
          return dieAfterFlush(res);
        }
        res.write(event);
        eventsWritten++;
      }
      res.uncork();
      if (last) res.end();
    },
  });
  res.once('close', () => {
    job.cancel();
    if (admitted) engine.release(rank);
  });
}

function answerBody(generation: Generation, timed: TimedGeneration): string {
  let text = completionBody(generation);
  if (timed.eos) text = text.replace(/"finish_reason":"length"/g, '"finish_reason":"stop"');
  // vLLM's answers carry the parameters as a top-level member.
  if (timed.leg?.kind === 'prefill') text = `${text.slice(0, -1)},"kv_transfer_params":${timed.leg.params ?? 'null'}}`;
  return text;
}
