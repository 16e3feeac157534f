import { isModelName } from '../upstreams/model-options';

/** One entry of a vLLM server's `GET /v1/models`: a served model, or a LoRA adapter (`parent` = its base model). */
export interface ModelCard {
  readonly id: string;
  /** The base model of a LoRA adapter; `null` for a base model. */
  readonly parent: string | null;
  /** The card as the server sent it, answered again in the gateway's union. */
  readonly card: Readonly<Record<string, unknown>>;
}

/** More cards than any server lists (each LoRA adapter is one); a hostile list is cut here. */
export const MAX_MODEL_CARDS = 1024;

/**
 * Reads vLLM's `{"object":"list","data":[{"id", "parent", …}]}`. Cards without a usable `id`
 * are skipped; `undefined` when the text is not such a list at all.
 */
export function parseModelList(text: string): ModelCard[] | undefined {
  let list: unknown;
  try {
    list = JSON.parse(text);
  } catch {
    return undefined;
  }
  const data = typeof list === 'object' && list !== null ? (list as { data?: unknown }).data : undefined;
  if (!Array.isArray(data)) return undefined;
  const cards: ModelCard[] = [];
  const seen = new Set<string>();
  for (const entry of data) {
    if (cards.length === MAX_MODEL_CARDS) break;
    if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) continue;
    const { id, parent } = entry as { id?: unknown; parent?: unknown };
    if (!isModelName(id) || seen.has(id)) continue;
    seen.add(id);
    cards.push({ id, parent: isModelName(parent) ? parent : null, card: entry as Record<string, unknown> });
  }
  return cards;
}

/** A card for a model only configured (no list learned): vLLM's fields, with what the gateway cannot know left null. */
export function configuredCard(id: string): ModelCard {
  return { id, parent: null, card: { id, object: 'model', owned_by: 'vllm', root: id, parent: null, max_model_len: null, permission: [] } };
}

/**
 * The gateway's `GET /v1/models`: every card once (the first met wins), in vLLM's shape, with
 * `created` set to now as vLLM sets it per request.
 */
export function modelListBody(cards: Iterable<ModelCard>, nowSeconds: number): string {
  const seen = new Set<string>();
  const data: Array<Record<string, unknown>> = [];
  for (const { id, card } of cards) {
    if (seen.has(id)) continue;
    seen.add(id);
    data.push({ ...card, id, object: 'model', created: nowSeconds });
  }
  return JSON.stringify({ object: 'list', data });
}
