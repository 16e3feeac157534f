// node .ci/import-cycles.mjs [dir...]: fails when the relative imports of the TypeScript files
// under the given folders (default: lib bench) form a cycle. Type-only imports count: a cycle
// of types is still a knot the next reader has to untie.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

const roots = process.argv.slice(2).length > 0 ? process.argv.slice(2) : ['lib', 'bench'];
const files = roots.flatMap((root) => walk(resolve(root)));
const IMPORT = /(?:^|[\s;])(?:import|export)\s+(?:type\s+)?(?:[^'";]*?\sfrom\s+)?['"](\.[^'"]+)['"]|import\(\s*['"](\.[^'"]+)['"]\s*\)|require\(\s*['"](\.[^'"]+)['"]\s*\)/g;

const graph = new Map();
for (const file of files) {
  const text = readFileSync(file, 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');
  const targets = new Set();
  for (const match of text.matchAll(IMPORT)) {
    const target = resolveModule(dirname(file), match[1] ?? match[2] ?? match[3]);
    if (target !== undefined) targets.add(target);
  }
  graph.set(file, [...targets]);
}

const state = new Map();
const stack = [];
const cycles = [];
for (const file of graph.keys()) visit(file);
if (cycles.length > 0) {
  for (const cycle of cycles) process.stderr.write(`import cycle: ${cycle.map((file) => relative(process.cwd(), file)).join(' → ')}\n`);
  process.exit(1);
}
process.stdout.write(`no import cycle among ${graph.size} files under ${roots.join(', ')}\n`);

function visit(file) {
  if (state.get(file) === 'done') return;
  if (state.get(file) === 'open') {
    cycles.push([...stack.slice(stack.indexOf(file)), file]);
    return;
  }
  state.set(file, 'open');
  stack.push(file);
  for (const target of graph.get(file) ?? []) if (graph.has(target)) visit(target);
  stack.pop();
  state.set(file, 'done');
}

function resolveModule(from, specifier) {
  const base = resolve(from, specifier);
  for (const candidate of [base, `${base}.ts`, `${base}.mts`, `${base}.js`, join(base, 'index.ts')]) {
    if (existsSync(candidate) && statSync(candidate).isFile()) return candidate;
  }
  return undefined;
}

function walk(dir) {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return entry.name === 'node_modules' ? [] : walk(path);
    return /\.(?:ts|mts)$/.test(entry.name) && !entry.name.endsWith('.d.ts') ? [path] : [];
  });
}
