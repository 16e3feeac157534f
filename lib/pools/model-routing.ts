import type { IncomingMessage, ServerResponse } from 'node:http';
import { sendError } from '../errors';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import { DEFAULT_MAX_LORA, LoraPreference } from './lora-preference';
import { MAX_MODEL_NAME, NO_MODEL } from '../upstreams/model-options';
import { ModelPools } from './model-pools';
import { watchModels, type ModelWatch } from './model-watch';
import { modelListBody } from './models';

function shownModels(models: readonly string[]): string {
  return models.length === 0 ? 'no model' : models.length > 8 ? `${models.slice(0, 8).join(', ')} and ${models.length - 8} more` : models.join(', ');
}

/** The paths whose bodies name the model they are for: without one, the router cannot route them. */
const MODEL_PATH = /\/(?:chat\/completions|completions|embeddings)$/;
const MODELS_PATH = '/v1/models';

/** The request path's model routing: pools by model, LoRA preference, the `GET /v1/models` union. */
export type ModelRouting = ReturnType<typeof createModelRouting>;

/**
 * Builds the model pools of the table's upstreams and the discovery of their models. Nothing
 * here runs per request unless some upstream's models are known.
 */
export function createModelRouting(table: EndpointTable, notice: (message: string) => void) {
  const pools = new ModelPools<RouteEndpoint>(table.upstreams);
  let watch: ModelWatch | undefined;
  const lora = new LoraPreference<RouteEndpoint>((endpoint) => watch?.maxLora(endpoint.upstream) ?? DEFAULT_MAX_LORA);
  // Routine news (info): each source named, so a model given in the configuration is never
  // said to come from the server's list.
  watch = watchModels(pools, table.upstreams, (upstream) => {
    const { listed, configured } = pools.sourcesOf(upstream);
    const also = configured.length === 0 ? '' : ` and ${shownModels(configured)} by its configuration`;
    notice(`express-dp-router: upstream '${upstream}' serves ${shownModels(listed)} by its /v1/models${also}; routing those models to it.`);
  });

  /** Whether this is `GET /v1/models` and the gateway knows models to answer it with. */
  function answersModelList(req: IncomingMessage & { originalUrl?: string }): boolean {
    if (!pools.listed || (req.method !== 'GET' && req.method !== 'HEAD')) return false;
    const url = req.originalUrl ?? req.url ?? '';
    const query = url.indexOf('?');
    return (query === -1 ? url : url.slice(0, query)) === MODELS_PATH;
  }

  function sendModelList(res: ServerResponse): void {
    const body = modelListBody(pools.cards(), Math.floor(Date.now() / 1000));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  }

  /**
   * The healthy endpoints that may serve a request for `model` (read from its JSON body), or
   * `undefined` after answering it: 400 without a string `model` where one is needed, 404
   * `NotFoundError` with vLLM's own text for a model no upstream serves.
   */
  function candidatesFor(res: ServerResponse, path: string, model: unknown): readonly RouteEndpoint[] | undefined {
    const healthy = table.healthy();
    if (model === NO_MODEL) {
      if (!MODEL_PATH.test(withoutQuery(path))) return healthy;
      sendError(res, 400, 'BadRequestError', 'The request body has no `model`; this gateway routes each request to the servers of its model.', 'model');
      return undefined;
    }
    if (typeof model !== 'string') {
      sendError(res, 400, 'BadRequestError', '`model` must be a string.', 'model');
      return undefined;
    }
    const found = pools.candidates(model, healthy);
    if (found === undefined) {
      const shownName = model.length > MAX_MODEL_NAME ? `${model.slice(0, MAX_MODEL_NAME)}…` : model;
      sendError(res, 404, 'NotFoundError', `The model \`${shownName}\` does not exist.`, 'model');
      return undefined;
    }
    return pools.isAdapter(model) ? lora.prefer(model, found) : found;
  }

  /** The endpoints a retry of a request for `model` may go to now. */
  function retryCandidates(model: string | undefined): readonly RouteEndpoint[] {
    const healthy = table.healthy();
    return model === undefined ? healthy : (pools.candidates(model, healthy) ?? []);
  }

  /** The request for `model` was sent to `endpoint`: an adapter is remembered there. */
  function sent(model: string, endpoint: RouteEndpoint): void {
    if (pools.isAdapter(model)) lora.sent(model, endpoint);
  }

  return {
    /** Its `active` says whether requests are routed by model now (so their JSON bodies are read), its `listed` whether the gateway answers `GET /v1/models`. */
    pools,
    lora,
    answersModelList,
    sendModelList,
    candidatesFor,
    retryCandidates,
    sent,
    /** The router's entries: those found by DNS declare their models before their names resolve. */
    declareSources(sources: readonly UpstreamConfig[]): void {
      const found = sources.filter((source) => source.dns !== undefined);
      pools.declare(
        found.flatMap((source) => source.models ?? []),
        found.some((source) => source.models === undefined),
      );
    },
    reconfigure(upstreams: readonly UpstreamConfig[], removed: readonly RouteEndpoint[]): void {
      pools.setUpstreams(upstreams);
      lora.forget(removed);
      watch?.sync(upstreams);
    },
    stop: () => watch?.stop(),
  };
}

function withoutQuery(path: string): string {
  const query = path.indexOf('?');
  return query === -1 ? path : path.slice(0, query);
}

