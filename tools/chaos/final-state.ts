// The database's state at the end of a chaos run, for the checker: every object the history names
// (read straight from Postgres, with its version) and the proxy's /v1/stats.
import pg from 'pg';
import type { QueryConfig } from 'pg';
import type { FinalState, StatsSnapshot, StoredObject } from './checker.ts';

/** The stored objects among `keys`. */
export function objectsByKey(keys: readonly string[]): QueryConfig<unknown[]> {
  return {
    name: 'fencepost_chaos_objects_by_key',
    text: 'SELECT key, body, token, version FROM fencepost.objects WHERE key = ANY($1::text[])',
    values: [keys],
  };
}

export async function readFinalState(databaseUrl: string, proxyUrl: string, keys: readonly string[]): Promise<FinalState> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  const objects = new Map<string, StoredObject>();
  try {
    const { rows } = await client.query<{ key: string; body: Buffer; token: string; version: string }>(objectsByKey(keys));
    for (const r of rows) objects.set(r.key, { body: r.body.toString('utf8'), token: BigInt(r.token), version: Number(r.version) });
  } finally {
    await client.end();
  }
  const res = await fetch(`${proxyUrl}/v1/stats?limit=1000`);
  if (!res.ok) throw new Error(`GET /v1/stats answered ${res.status}`);
  const stats = (await res.json()) as StatsSnapshot;
  return { objects, stats };
}
