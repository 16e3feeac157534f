import { integerOption, pathOf, section, type KeysEnum } from '../option-checks';

/**
 * `verdicts`: how much agreeing evidence from client traffic takes a verdict that changes
 * routing for every client of an upstream (docs/security.md, "Evidence that changes routing for
 * everyone"). The router's own probes confirm a verdict whatever this says.
 */
export interface VerdictsOptions {
  /**
   * Distinct sources (tenant, else credentials, else client address) whose evidence must agree
   * before client traffic alone takes a verdict; each source's share is capped, so fewer can at
   * most delay one. `1` lets any single client take them. Default: `3`.
   */
  minSources?: number;
}

/** `verdicts`, resolved. */
export interface VerdictsConfig {
  readonly minSources: number;
}

const KEYS: KeysEnum<VerdictsOptions> = { minSources: true };

export const DEFAULT_MIN_SOURCES = 3;

/** Parses `verdicts`; absent is the defaults. */
export function parseVerdicts(path: string, value: unknown): VerdictsConfig {
  const verdicts = section(path, value, KEYS);
  return { minSources: integerOption(pathOf(path, 'minSources'), verdicts.minSources, DEFAULT_MIN_SOURCES, 1, 64) };
}
