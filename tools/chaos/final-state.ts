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

/**
 * Every proxy's SQL-door counts in the database: each proxy's /v1/stats flushes its own, and says
 * what its flush could not add yet (`unflushedAccepted`, retried until 0 or `waitMs` passes).
 */
export async function flushEveryProxy(proxyUrls: readonly string[], waitMs = 30_000): Promise<void> {
  const deadline = Date.now() + waitMs;
  for (const url of proxyUrls) {
    for (;;) {
      let last: string;
      try {
        const res = await fetch(`${url}/v1/stats?limit=1`);
        const body = (await res.json()) as { unflushedAccepted?: number };
        if (res.ok && body.unflushedAccepted === 0) break;
        last = res.ok ? `${body.unflushedAccepted} accepted counts not flushed` : `GET /v1/stats answered ${res.status}`;
      } catch (err) {
        last = (err as Error).message;
      }
      if (Date.now() > deadline) throw new Error(`${url}: its counts are not all in the database: ${last}`);
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

/** The stored objects and the stats, once every proxy in `proxyUrls` has flushed its counts; stats read from the first. */
export async function readFinalState(databaseUrl: string, proxyUrls: readonly string[], keys: readonly string[]): Promise<FinalState> {
  await flushEveryProxy(proxyUrls);
  const proxyUrl = proxyUrls[0]!;
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
