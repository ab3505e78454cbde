// Who waits on whom in Postgres, for tests that prove a lock wait without timing: pg_blocking_pids
// and pg_locks, polled until the wait shows (or what it waits for settles first).
import type pg from 'pg';

/** The backend pid of a client's session. */
export async function backendPid(client: pg.Client | pg.PoolClient): Promise<number> {
  return (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
}

/** Backends that wait on a lock held by `pid` (pg_blocking_pids), in pid order. */
export async function waitersOn(pool: pg.Pool, pid: number): Promise<number[]> {
  const { rows } = await pool.query<{ pid: number }>(
    'SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)) ORDER BY pid',
    [pid],
  );
  return rows.map((r) => r.pid);
}

/**
 * Whether backend `pid` waits to lock a row of `relation` (a granted `tuple` lock on it: the place
 * in line Postgres takes before it waits for the transaction holding the row).
 */
export async function waitsOnRowOf(pool: pg.Pool, pid: number, relation: string): Promise<boolean> {
  const { rows } = await pool.query(
    `SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'tuple' AND relation = $2::regclass AND granted`,
    [pid, relation],
  );
  return rows.length > 0;
}

/** A promise's state, readable synchronously: `done` once it settled. */
export function settled<T>(p: Promise<T>): { done: boolean } {
  const s = { done: false };
  void p.then(
    () => (s.done = true),
    () => (s.done = true),
  );
  return s;
}

/**
 * Polls `probe` until it returns something other than undefined. Before each poll, `failIf` may
 * name a reason to stop (what should be waiting has already settled): then this throws it. Gives
 * up after `limit` polls, 20 ms apart; the bound only keeps a broken test from hanging.
 */
export async function pollUntil<T>(
  what: string,
  probe: () => Promise<T | undefined>,
  failIf: () => string | null = () => null,
  limit = 1000,
): Promise<T> {
  for (let i = 0; i < limit; i++) {
    const reason = failIf();
    if (reason !== null) throw new Error(`${what}: ${reason}`);
    const found = await probe();
    if (found !== undefined) return found;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`${what}: not seen after ${limit} polls`);
}
