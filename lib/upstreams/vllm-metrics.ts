/** What one scrape of a vLLM server's `/metrics` says per engine (global rank). */
export interface EngineReport {
  /** Distinct `engine` label values seen on any `vllm:` sample, ascending. */
  readonly engines: readonly number[];
  /** `vllm:num_requests_running` + `vllm:num_requests_waiting` per engine (summed over models). */
  readonly load: ReadonlyMap<number, EngineLoad>;
}

export interface EngineLoad {
  running: number;
  waiting: number;
}

/** More engines than any deployment has; a cap keeps a hostile page from growing our state. */
const MAX_ENGINES = 65_536;
const ENGINE_LABEL = /[{,]\s*engine="(0|[1-9][0-9]{0,9})"/;
const SAMPLE_VALUE = /\}\s*(\S+)(?:\s+\S+)?\s*$/;

/**
 * Reads the engine labels and queue sizes from vLLM's Prometheus text. Unknown lines,
 * comments and malformed samples are skipped: a scrape must never break routing.
 */
export function parseEngineReport(text: string): EngineReport {
  const engines = new Set<number>();
  const load = new Map<number, EngineLoad>();
  let start = 0;
  while (start < text.length) {
    let end = text.indexOf('\n', start);
    if (end === -1) end = text.length;
    if (text.startsWith('vllm:', start)) readSample(text.slice(start, end), engines, load);
    start = end + 1;
  }
  return { engines: [...engines].sort((a, b) => a - b), load };
}

function readSample(line: string, engines: Set<number>, load: Map<number, EngineLoad>): void {
  const engineMatch = ENGINE_LABEL.exec(line);
  if (!engineMatch) return;
  const engine = Number(engineMatch[1]);
  if (!engines.has(engine)) {
    if (engines.size >= MAX_ENGINES) return;
    engines.add(engine);
  }
  const field = line.startsWith('vllm:num_requests_running{') ? 'running' : line.startsWith('vllm:num_requests_waiting{') ? 'waiting' : undefined;
  if (field === undefined) return;
  const value = Number(SAMPLE_VALUE.exec(line)?.[1]);
  if (!Number.isFinite(value) || value < 0) return;
  const entry = load.get(engine) ?? { running: 0, waiting: 0 };
  entry[field] += value;
  load.set(engine, entry);
}
