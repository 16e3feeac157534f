import type { UpstreamConfig } from '../upstreams/upstream-options';
import { configuredCard, type ModelCard } from './models';

/** What a pool needs of an endpoint: the upstream it belongs to. */
export interface PooledEndpoint {
  readonly upstream: string;
}

/**
 * Which upstreams serve which model: configured (`upstreams[].models`) and learned (their
 * `GET /v1/models`, with `discover`). An upstream with neither serves every model. The
 * candidate lists per model are rebuilt when the healthy endpoints or the model sets change,
 * never per request.
 */
export class ModelPools<E extends PooledEndpoint> {
  private configured = new Map<string, readonly string[]>();
  private learned = new Map<string, readonly ModelCard[]>();
  /** Served model names per upstream; absent: it serves every model. */
  private served = new Map<string, ReadonlySet<string>>();
  private wildcard = false;
  /** Models of DNS entries, known before (and whether or not) their names resolve; `everyModel`: some such entry serves every model. */
  private declared: { models: ReadonlySet<string>; everyModel: boolean } = { models: new Set(), everyModel: false };
  private adapters = new Set<string>();
  private known = new Set<string>();
  private upstreamNames: readonly string[] = [];
  // The candidate lists, for the healthy list they were made from.
  private madeFrom: readonly E[] | undefined;
  private byModel = new Map<string, readonly E[]>();
  private everyModel: readonly E[] = [];

  constructor(upstreams: readonly UpstreamConfig[]) {
    this.setUpstreams(upstreams);
  }

  /**
   * Whether requests are routed by model: some upstream has configured models, or the learned
   * sets differ. A fleet that all serves the same models (or says nothing) is not: its engines
   * answer an unknown model themselves, and no body is read for it. Read on every request, so a
   * field (set when the models change), not a getter: a getter call there costs more than the
   * test it guards.
   */
  active = false;

  /** Whether any upstream's models are known, so that the gateway answers `GET /v1/models` with their union. A field, as `active`. */
  listed = false;

  /** Follows a change of upstreams: their configured models; what removed upstreams taught is dropped. */
  setUpstreams(upstreams: readonly UpstreamConfig[]): void {
    this.configured = new Map(upstreams.filter((upstream) => upstream.models !== undefined).map((upstream) => [upstream.name, upstream.models!]));
    const names = new Set(upstreams.map((upstream) => upstream.name));
    for (const name of this.learned.keys()) if (!names.has(name)) this.learned.delete(name);
    this.upstreamNames = [...names];
    this.rebuild();
  }

  /**
   * The models of the entries found by DNS (`everyModel`: one of them names none). A model of
   * such an entry is known even while the entry has no address: with no endpoint serving it, it
   * gets a 503, not the 404 of a model nobody serves; so does any model while an entry that
   * serves every model has none.
   */
  declare(models: Iterable<string>, everyModel: boolean): void {
    this.declared = { models: new Set(models), everyModel };
    this.rebuild();
  }

  /** What an upstream's `GET /v1/models` listed. Returns whether its models changed. */
  learn(upstream: string, cards: readonly ModelCard[]): boolean {
    if (!this.upstreamNames.includes(upstream)) return false;
    const before = this.learned.get(upstream);
    if (before !== undefined && sameIds(before, cards)) {
      this.learned.set(upstream, cards);
      return false;
    }
    this.learned.set(upstream, cards);
    this.rebuild();
    return true;
  }

  /** The model ids an upstream's `GET /v1/models` listed last, and its configured ones it did not list. */
  sourcesOf(upstream: string): { listed: string[]; configured: string[] } {
    const listed = (this.learned.get(upstream) ?? []).map((card) => card.id);
    return { listed, configured: (this.configured.get(upstream) ?? []).filter((id) => !listed.includes(id)) };
  }

  /** The models an upstream serves now, configured and learned; empty when it serves every model. */
  modelsOf(upstream: string): readonly string[] {
    return [...(this.served.get(upstream) ?? [])];
  }

  /** Whether the upstream serves `model` (an upstream whose models are not known serves every model). */
  serves(upstream: string, model: string): boolean {
    const models = this.served.get(upstream);
    return models === undefined || models.has(model);
  }

  /** Whether `model` is a LoRA adapter (a learned card with a `parent`). */
  isAdapter(model: string): boolean {
    return this.adapters.has(model);
  }

  /** Whether the upstream lists any LoRA adapter. */
  hasAdapters(upstream: string): boolean {
    return this.learned.get(upstream)?.some((card) => card.parent !== null) === true;
  }

  /**
   * The healthy endpoints (of `healthy`, the table's list) that serve `model`; `undefined` when
   * no upstream, healthy or not, serves it (nor every model), and no DNS entry declares it.
   */
  candidates(model: string, healthy: readonly E[]): readonly E[] | undefined {
    if (healthy !== this.madeFrom) this.split(healthy);
    const found = this.byModel.get(model);
    if (found !== undefined) return found;
    if (this.wildcard) return this.everyModel;
    return this.declared.everyModel ? [] : undefined;
  }

  /** Every card, configured and learned, in upstream order, for the gateway's `GET /v1/models`. */
  *cards(): Iterable<ModelCard> {
    for (const name of this.upstreamNames) {
      const learned = this.learned.get(name);
      if (learned !== undefined) yield* learned;
      for (const id of this.configured.get(name) ?? []) yield configuredCard(id);
    }
  }

  private rebuild(): void {
    this.served = new Map();
    this.adapters = new Set();
    this.known = new Set();
    for (const name of this.upstreamNames) {
      const learned = this.learned.get(name);
      const configured = this.configured.get(name);
      if (learned === undefined && configured === undefined) continue;
      const models = new Set([...(configured ?? []), ...(learned ?? []).map((card) => card.id)]);
      for (const card of learned ?? []) if (card.parent !== null) this.adapters.add(card.id);
      for (const model of models) this.known.add(model);
      this.served.set(name, models);
    }
    for (const model of this.declared.models) this.known.add(model);
    this.wildcard = this.served.size < this.upstreamNames.length;
    const distinct = new Set([...this.served.values()].map((models) => [...models].sort().join('\n')));
    this.active = this.configured.size > 0 || this.declared.models.size > 0 || distinct.size > 1 || (distinct.size === 1 && this.wildcard);
    this.listed = this.served.size > 0;
    this.madeFrom = undefined;
  }

  private split(healthy: readonly E[]): void {
    const byModel = new Map<string, E[]>();
    const everyModel: E[] = [];
    for (const model of this.known) byModel.set(model, []);
    for (const endpoint of healthy) {
      const models = this.served.get(endpoint.upstream);
      if (models === undefined) {
        everyModel.push(endpoint);
        for (const list of byModel.values()) list.push(endpoint);
      } else {
        for (const model of models) byModel.get(model)!.push(endpoint);
      }
    }
    this.byModel = byModel;
    this.everyModel = everyModel;
    this.madeFrom = healthy;
  }
}

function sameIds(a: readonly ModelCard[], b: readonly ModelCard[]): boolean {
  return a.length === b.length && a.every((card, index) => card.id === b[index].id && card.parent === b[index].parent);
}
