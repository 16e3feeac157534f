// Builds what the package ships: the CommonJS build with declarations in dist/cjs (compiler
// options from tsconfig.json, entry lib/index.ts only), and a thin ESM entry in dist/esm that
// re-exports it. One implementation for both module systems: no dual-package hazard (one
// module state, one set of metric families, one `instanceof`).
import { createRequire } from 'node:module';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(join(root, 'package.json'));
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

function fail(list, message) {
  if (list.length > 0) {
    const host = { getCanonicalFileName: (name) => name, getCurrentDirectory: () => root, getNewLine: () => '\n' };
    process.stderr.write(ts.formatDiagnosticsWithColorAndContext(list, host));
  }
  process.stderr.write(`build failed${message ? `: ${message}` : ''}\n`);
  process.exit(1);
}
