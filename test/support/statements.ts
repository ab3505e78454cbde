// A pool that records the name of every named statement run through it (src/fence/sql/
// names the fence's statements), so a test can tell which statement carried a write: through
// pool.query and through the clients pool.connect hands out alike.
import type pg from 'pg';

export function recordingStatements(pool: pg.Pool): { pool: pg.Pool; names: string[] } {
  const names: string[] = [];
  const note = (config: unknown) => {
    if (typeof config === 'object' && config !== null && (config as { name?: string }).name !== undefined)
      names.push((config as { name: string }).name);
  };
  const recordingClient = (client: pg.PoolClient): pg.PoolClient =>
    new Proxy(client, {
      get(target, prop, receiver) {
        if (prop !== 'query') return Reflect.get(target, prop, receiver) as unknown;
        return (config: unknown, ...rest: unknown[]) => {
          note(config);
          return (target.query as (...a: unknown[]) => unknown).call(target, config, ...rest);
        };
      },
    });
  const wrapped = new Proxy(pool, {
    get(target, prop, receiver) {
      if (prop === 'query') {
        return (config: unknown, ...rest: unknown[]) => {
          note(config);
          return (target.query as (...a: unknown[]) => unknown).call(target, config, ...rest);
        };
      }
      if (prop === 'connect') return async () => recordingClient(await target.connect());
      return Reflect.get(target, prop, receiver) as unknown;
    },
  });
  return { pool: wrapped, names };
}
