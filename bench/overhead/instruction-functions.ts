/**
 * Where a contender's instructions go, per function: reads a callgrind dump of its main thread
 * and the V8 perf map its process wrote (`--perf-basic-prof`, /tmp/perf-<pid>.map), so that the
 * JIT code callgrind knows only by address is named after its JavaScript function. Used by
 * `npm run bench:instructions -- … --functions`.
 */
import { existsSync, readFileSync } from 'node:fs';

/** Self instructions per function name, over the counted requests. */
export type FunctionCosts = Map<string, number>;

/** Self instructions by function in a callgrind file, JIT addresses named from `perfMap` when given. */
export function functionCosts(callgrindFile: string, perfMap: string | undefined): FunctionCosts {
  const names = perfMap !== undefined && existsSync(perfMap) ? readPerfMap(perfMap) : undefined;
  const compressed = new Map<string, string>();
  const costs: FunctionCosts = new Map();
  let current = '';
  let skipNext = false;
  for (const line of readFileSync(callgrindFile, 'utf8').split('\n')) {
    if (line.startsWith('fn=')) {
      current = name(line.slice(3), compressed);
      continue;
    }
    if (line.startsWith('cfn=')) {
      name(line.slice(4), compressed);
      continue;
    }
    // The cost line after `calls=` is the callee's inclusive cost, not this function's own.
    if (line.startsWith('calls=')) {
      skipNext = true;
      continue;
    }
    const first = line.charCodeAt(0);
    const isCost = (first >= 0x30 && first <= 0x39) || first === 0x2b || first === 0x2d || first === 0x2a;
    if (!isCost) continue;
    if (skipNext) {
      skipNext = false;
      continue;
    }
    const ir = Number(line.split(' ')[1] ?? 0);
    if (ir > 0) costs.set(current, (costs.get(current) ?? 0) + ir);
  }
  if (names === undefined) return costs;
  const named: FunctionCosts = new Map();
  for (const [fn, ir] of costs) {
    const label = /^0x[0-9a-f]+$/.test(fn) ? (names.find(Number.parseInt(fn, 16)) ?? 'JIT code (unnamed)') : fn;
    named.set(label, (named.get(label) ?? 0) + ir);
  }
  return named;
}

/** `fn=(12) name` defines id 12; `fn=(12)` uses it. */
function name(spec: string, compressed: Map<string, string>): string {
  const match = /^\((\d+)\)(?: (.*))?$/.exec(spec);
  if (match === null) return spec;
  if (match[2] !== undefined) compressed.set(match[1], match[2]);
  return compressed.get(match[1]) ?? spec;
}

/** The perf map's code ranges, sorted, looked up by address. Tier marks (`*`, `~`, `^`, `+`) are dropped so every tier of a function sums. */
function readPerfMap(path: string) {
  const starts: number[] = [];
  const ends: number[] = [];
  const labels: string[] = [];
  const entries = readFileSync(path, 'utf8')
    .split('\n')
    .map((line) => /^([0-9a-f]+) ([0-9a-f]+) (.*)$/.exec(line))
    .filter((match): match is RegExpExecArray => match !== null)
    .map((match) => ({ start: Number.parseInt(match[1], 16), size: Number.parseInt(match[2], 16), label: cleanLabel(match[3]) }))
    .sort((a, b) => a.start - b.start);
  for (const entry of entries) {
    starts.push(entry.start);
    ends.push(entry.start + entry.size);
    labels.push(entry.label);
  }
  return {
    find(address: number): string | undefined {
      let low = 0;
      let high = starts.length - 1;
      let found = -1;
      while (low <= high) {
        const mid = (low + high) >> 1;
        if (starts[mid] <= address) {
          found = mid;
          low = mid + 1;
        } else high = mid - 1;
      }
      // A later entry for the same range (code recompiled in place) wins by order of the sort; close enough.
      return found >= 0 && address < ends[found] ? labels[found] : undefined;
    },
  };
}

function cleanLabel(label: string): string {
  return label
    .replace(/^(?:JS|LazyCompile|Function|Builtin|Handler|Stub|BytecodeHandler|RegExp):?\s*/, '')
    .replace(/^[*~^+]/, '')
    .replace(/file:\/\//, '')
    .replace(/\S*\/node_modules\//, '~/')
    .replace(/\S*\/(?:dist\/cjs|bench\/results\/\.rev-\w+\/dist\/cjs)\//, 'lib/')
    .replace(/\S*\/(?=lib\/)/, '');
}

/** Where a function belongs, for the per-area table. */
export function areaOf(label: string): string {
  if (label.startsWith('lib/') || / lib\//.test(label)) return 'express-dp-router';
  const pkg = /~\/((?:@[^/]+\/)?[^/]+)/.exec(label);
  if (pkg) return pkg[1];
  if (/node:|^\S+ node:/.test(label)) return 'node core (JS)';
  if (label.startsWith('Builtins_') || label.startsWith('Builtin:')) return 'V8 builtins';
  if (/Scaveng|MarkCompact|Heap::|Sweeper|GCTracer|Marking|Evacuat|Heap/.test(label)) return 'garbage collection';
  if (/^JIT code|^0x/.test(label)) return 'JIT code (unnamed)';
  return 'C++ (V8, Node, libc)';
}
