import { realpathSync } from 'node:fs';
import { dirname } from 'node:path';
import { register, type Registry } from 'prom-client';

/**
 * Whether the router's metrics reach the app's registry. prom-client is a peer dependency: an
 * app that installs the package from npm or from its tarball has one copy, its own, whose global
 * `register` is the router's default. Installed from a folder (`npm install ../express-dp-router`,
 * `npm link`), the package is a symlink to a clone whose own `node_modules/prom-client` is what
 * the router loads (Node resolves from the real path): its global registry is not the one the
 * app's `require('prom-client').register` shows, and every `dp_router_*` series is missing there.
 */

/** Where `prom-client` resolves from the first of `paths` it resolves from, as a real path; `undefined` from none. */
function resolvedFrom(paths: readonly string[]): string | undefined {
  try {
    return realpathSync(require.resolve('prom-client', { paths: [...paths] }));
  } catch {
    return undefined;
  }
}

/** The directories an app resolves its packages from: its main module's (CommonJS), and the working directory. */
function appDirectories(): string[] {
  const main = require.main?.filename;
  return main === undefined ? [process.cwd()] : [dirname(main), process.cwd()];
}

/**
 * The sentence to warn with when `registry` is the global registry of a prom-client other than
 * the app's; `undefined` when it is not (a registry the app passed is its own), or when the app
 * resolves no prom-client of its own (it reads the router's series through `router.registry`).
 */
export function foreignRegistryNotice(registry: Registry, apps: readonly string[] = appDirectories()): string | undefined {
  if (registry !== register) return undefined;
  const ours = resolvedFrom([__dirname]);
  const theirs = resolvedFrom(apps);
  if (ours === undefined || theirs === undefined || ours === theirs) return undefined;
  return (
    `express-dp-router: its metrics go to the global registry of the prom-client at ${dirname(ours)}, but this app's require('prom-client') ` +
    `is the one at ${dirname(theirs)}: that one's \`register\` shows no dp_router_* series. A package installed from a folder ` +
    '(`npm install ../express-dp-router`, `npm link`) brings its own prom-client: install the packed tarball instead (README, Install), ' +
    "or pass your registry: dpRouter({ metrics: { registry: require('prom-client').register }, … })."
  );
}
