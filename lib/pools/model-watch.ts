import { DISCOVER_TIMEOUT_MS } from '../upstreams/engine-watch-options';
import { fetchText } from '../upstreams/scrape';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import { readMaxLora } from './lora-metric';
import type { ModelPools, PooledEndpoint } from './model-pools';
import { parseModelList } from './models';

/** Reads the models of every upstream with `discover`; `sync()` follows a reconfiguration. */
export interface ModelWatch {
  sync(upstreams: readonly UpstreamConfig[]): void;
  /** The engines' `max_lora` per upstream, as their `/metrics` said; absent until it has. */
  maxLora(upstream: string): number | undefined;
  stop(): void;
}

interface Target {
  readonly name: string;
  readonly url: string;
  readonly intervalMs: number;
  timer: NodeJS.Timeout | undefined;
  readonly abort: AbortController;
}

/**
 * Polls `GET /v1/models` of each upstream that discovers (at start, then every `discover`
 * interval after the last answer) and teaches `pools` what it lists; where the list has LoRA
 * adapters, `/metrics` too for `max_lora`. A failed poll keeps what was learned.
 */
export function watchModels(pools: ModelPools<PooledEndpoint>, upstreams: readonly UpstreamConfig[], changed: (upstream: string) => void): ModelWatch {
  const targets = new Map<string, Target>();
  const maxLora = new Map<string, number>();
  let stopped = false;

  const poll = async (target: Target) => {
    target.timer = undefined;
    const live = () => !stopped && targets.get(target.name) === target;
    try {
      const cards = parseModelList(await fetchText(`${target.url}/v1/models`, DISCOVER_TIMEOUT_MS, target.abort.signal));
      if (cards !== undefined && live() && pools.learn(target.name, cards)) changed(target.name);
      if (live() && pools.hasAdapters(target.name)) {
        const found = readMaxLora(await fetchText(`${target.url}/metrics`, DISCOVER_TIMEOUT_MS, target.abort.signal));
        if (found !== undefined && live()) maxLora.set(target.name, found);
      }
    } catch {
      // Kept as learned: the upstream's health is the health checker's and the outlier detector's to judge.
    }
    if (live()) target.timer = setTimeout(() => void poll(target), target.intervalMs).unref();
  };

  const end = (target: Target) => {
    clearTimeout(target.timer);
    target.abort.abort();
  };

  const sync = (current: readonly UpstreamConfig[]) => {
    if (stopped) return;
    const wanted = new Map(current.filter((upstream) => upstream.discoverIntervalMs !== undefined).map((upstream) => [upstream.name, upstream]));
    for (const [name, target] of targets) {
      const want = wanted.get(name);
      if (want !== undefined && want.url === target.url && want.discoverIntervalMs === target.intervalMs) continue;
      end(target);
      targets.delete(name);
      maxLora.delete(name);
    }
    for (const [name, upstream] of wanted) {
      if (targets.has(name)) continue;
      const target: Target = { name, url: upstream.url, intervalMs: upstream.discoverIntervalMs!, timer: undefined, abort: new AbortController() };
      targets.set(name, target);
      void poll(target);
    }
  };

  sync(upstreams);
  return {
    sync,
    maxLora: (upstream) => maxLora.get(upstream),
    stop: () => {
      stopped = true;
      for (const target of targets.values()) end(target);
      targets.clear();
    },
  };
}
