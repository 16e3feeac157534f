/**
 * npx tsx bench/lora.ts [requests] (npm run bench:lora)
 *
 * LoRA adapter loads per 1000 requests: 8 adapters over 8 ranks whose engines hold 2 at a
 * time (`--max-loras 2`), with and without the router's LoRA preference
 * (lib/pools/lora-preference.ts, the code the router runs). A simulation: requests arrive as
 * a Poisson stream and hold their rank for an exponential time (4 in flight per rank on
 * average); each rank's engine keeps its adapters in `max_lora` slots, least recently used
 * evicted, and a request whose adapter is not in a slot loads it (one load). vLLM cannot evict
 * an adapter a running request uses, so the engine here is kinder to round-robin than a real
 * one: the figures understate what swapping costs it. Deterministic (seeded).
 */
import { LoraPreference } from '../lib/pools/lora-preference';
import { fixed, markdownTable } from './lib/stats';
import { seededRng } from './routing/rng';

const RANKS = 8;
const ADAPTERS = 8;
const MAX_LORA = 2;
const IN_FLIGHT_PER_RANK = 4;

interface SimEndpoint {
  readonly rank: number;
  load: number;
  /** The engine's slots, most recent first. */
  readonly slots: string[];
}

type Base = 'round-robin' | 'least-outstanding';
type Mix = 'uniform' | 'skewed';

function simulate(requests: number, base: Base, preferLoaded: boolean, mix: Mix) {
  const random = seededRng(42);
  const endpoints: SimEndpoint[] = Array.from({ length: RANKS }, (_, rank) => ({ rank, load: 0, slots: [] }));
  const preference = new LoraPreference<SimEndpoint>(() => MAX_LORA);
  // Skewed: adapter i drawn with weight 1/(i+1) (a Zipf mix: the first takes a third of the traffic).
  const weights = Array.from({ length: ADAPTERS }, (_, i) => (mix === 'uniform' ? 1 : 1 / (i + 1)));
  const total = weights.reduce((sum, weight) => sum + weight, 0);
  const draw = () => {
    let at = random() * total;
    for (let i = 0; i < ADAPTERS; i++) if ((at -= weights[i]) < 0) return `lora-${i}`;
    return `lora-${ADAPTERS - 1}`;
  };
  const serviceMean = 1;
  const arrivalGap = serviceMean / (RANKS * IN_FLIGHT_PER_RANK);
  const departures: Array<{ at: number; endpoint: SimEndpoint }> = [];
  let now = 0;
  let turn = 0;
  let loads = 0;
  let imbalance = 0;
  for (let request = 0; request < requests; request++) {
    now += -Math.log(1 - random()) * arrivalGap;
    for (let i = departures.length - 1; i >= 0; i--) {
      if (departures[i].at > now) continue;
      departures[i].endpoint.load--;
      departures.splice(i, 1);
    }
    const adapter = draw();
    const candidates = preferLoaded ? preference.prefer(adapter, endpoints) : endpoints;
    let chosen: SimEndpoint;
    if (base === 'round-robin') {
      chosen = candidates[turn++ % candidates.length];
    } else {
      chosen = candidates[0];
      for (const endpoint of candidates) if (endpoint.load < chosen.load) chosen = endpoint;
    }
    if (preferLoaded) preference.sent(adapter, chosen);
    const slot = chosen.slots.indexOf(adapter);
    if (slot === -1) {
      loads++;
      chosen.slots.unshift(adapter);
      if (chosen.slots.length > MAX_LORA) chosen.slots.pop();
    } else if (slot > 0) {
      chosen.slots.splice(slot, 1);
      chosen.slots.unshift(adapter);
    }
    chosen.load++;
    let busiest = 0;
    for (const endpoint of endpoints) busiest = Math.max(busiest, endpoint.load);
    imbalance += busiest;
    departures.push({ at: now - Math.log(1 - random()) * serviceMean, endpoint: chosen });
  }
  return { loadsPer1000: (loads / requests) * 1000, busiest: imbalance / requests };
}

function main(): void {
  const requests = Number(process.argv[2] ?? 100_000);
  const rows: string[][] = [];
  for (const mix of ['uniform', 'skewed'] as const) {
    for (const base of ['round-robin', 'least-outstanding'] as const) {
      const plain = simulate(requests, base, false, mix);
      const aware = simulate(requests, base, true, mix);
      rows.push([mix, base, fixed(plain.loadsPer1000, 1), fixed(aware.loadsPer1000, 1), fixed(plain.busiest, 2), fixed(aware.busiest, 2)]);
    }
  }
  process.stdout.write(
    `${requests} requests, ${ADAPTERS} adapters over ${RANKS} ranks, max_lora ${MAX_LORA}, ${IN_FLIGHT_PER_RANK} in flight per rank on average:\n\n`,
  );
  process.stdout.write(
    `${markdownTable(['adapter mix', 'policy', 'loads/1000, policy alone', 'loads/1000, LoRA preference', 'busiest rank in flight, alone', 'busiest, LoRA preference'], rows)}\n`,
  );
}

main();
