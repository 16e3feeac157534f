// Builds what the package ships: the CommonJS build with declarations in dist/cjs (compiler
// options from tsconfig.json, entry lib/index.ts only), and a thin ESM entry in dist/esm that
// re-exports it. One implementation for both module systems: no dual-package hazard (one
// module state, one set of metric families, one `instanceof`).
//
// A build whose inputs (lib/, the compiler settings, the pinned dependencies, this script) are
// byte for byte those of the last one is skipped: `npm ci` and `npm pack` build through `prepare`, and the
// tests pack the tarball once per Node line. `--force` builds anyway.
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(join(root, 'package.json'));
const stamp = join(root, 'node_modules', '.cache', 'express-dp-router', 'build-inputs.sha256');
const outputs = ['dist/cjs/index.js', 'dist/cjs/index.d.ts', 'dist/esm/index.mjs', 'dist/esm/index.d.mts'];

const inputs = inputsHash();
if (!process.argv.includes('--force') && readOr(stamp) === inputs && outputs.every((file) => existsSync(join(root, file)))) {
  process.stderr.write('dist/ was built from these sources already (npm run build -- --force to rebuild)\n');
  process.exit(0);
}
// Gone before dist/ is touched, so an interrupted build is never taken for a finished one.
rmSync(stamp, { force: true });

const ts = require('typescript');

rmSync(join(root, 'dist'), { recursive: true, force: true });

const parsed = ts.getParsedCommandLineOfConfigFile(
  join(root, 'tsconfig.json'),
  { noEmit: false, declaration: true, rootDir: join(root, 'lib'), outDir: join(root, 'dist/cjs') },
  { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (diagnostic) => fail([diagnostic]) },
);
const program = ts.createProgram({ rootNames: [join(root, 'lib/index.ts')], options: parsed.options });
const emitted = program.emit();
const diagnostics = [...ts.getPreEmitDiagnostics(program), ...emitted.diagnostics];
if (diagnostics.length > 0 || emitted.emitSkipped) fail(diagnostics);

// Named exports are taken from the build itself, so the ESM entry cannot drift from index.ts.
const cjs = require(join(root, 'dist/cjs/index.js'));
const names = Object.keys(cjs).filter((name) => name !== 'default' && name !== '__esModule');
// dist/esm/index.d.mts below types the default export as dpRouter.
if (cjs.default !== cjs.dpRouter) fail([], 'the default export of lib/index.ts is no longer dpRouter: update .ci/build.mjs');
mkdirSync(join(root, 'dist/esm'), { recursive: true });
writeFileSync(
  join(root, 'dist/esm/index.mjs'),
  `import cjs from '../cjs/index.js';\n\nexport const { ${names.join(', ')} } = cjs;\nexport default cjs.default;\n`,
);
writeFileSync(
  join(root, 'dist/esm/index.d.mts'),
  `import { dpRouter } from '../cjs/index.js';\n\nexport * from '../cjs/index.js';\nexport default dpRouter;\n`,
);

mkdirSync(dirname(stamp), { recursive: true });
writeFileSync(stamp, inputs);

function inputsHash() {
  const hash = createHash('sha256');
  const files = ['tsconfig.json', 'package.json', 'package-lock.json', '.ci/build.mjs'];
  const walk = (dir) => {
    for (const entry of readdirSync(join(root, dir), { withFileTypes: true })) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory()) walk(path);
      else files.push(path);
    }
  };
  walk('lib');
  for (const file of files.sort()) hash.update(`${file}\0`).update(readFileSync(join(root, file))).update('\0');
  return hash.digest('hex');
}

function readOr(path) {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
}

function fail(list, message) {
  if (list.length > 0) {
    const host = { getCanonicalFileName: (name) => name, getCurrentDirectory: () => root, getNewLine: () => '\n' };
    process.stderr.write(ts.formatDiagnosticsWithColorAndContext(list, host));
  }
  process.stderr.write(`build failed${message ? `: ${message}` : ''}\n`);
  process.exit(1);
}
