// A pool that records the name of every named statement run through it (src/fence/queries.ts
// names the fence's statements), so a test can tell which statement carried a write.
import type pg from 'pg';

export function recordingStatements(pool: pg.Pool): { pool: pg.Pool; names: string[] } {
  const names: string[] = [];
  const wrapped = new Proxy(pool, {
    get(target, prop, receiver) {
      if (prop !== 'query') return Reflect.get(target, prop, receiver) as unknown;
      return (config: { name?: string } | string, ...rest: unknown[]) => {
        if (typeof config === 'object' && config?.name !== undefined) names.push(config.name);
        return (target.query as (...a: unknown[]) => unknown).call(target, config, ...rest);
      };
    },
  });
  return { pool: wrapped, names };
}
