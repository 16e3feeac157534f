import type { Registry } from 'prom-client';

/** The family `name` on `registry` when it is a `kind`, else a new one from `make`: routers sharing a registry share it. */
export function family<T>(registry: Registry, name: string, kind: abstract new (...args: never[]) => T, make: () => T): T {
  const existing = registry.getSingleMetric(name);
  return existing instanceof kind ? (existing as T) : make();
}
