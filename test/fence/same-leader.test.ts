// A leader's own sessions never fail on each other. The issue: the first transaction that created
// or raised a fence held the fence row for its whole length, so another session of the same leader
// (same token, same fence key) starting meanwhile got 55P03 "while inserting index tuple in
// relation fences". Now the raise commits in a transaction of the proxy's before the writer's
// starts, and the writer's transaction only shares the row: session B of the leader commits while
// session A is still open, on a new fence key and on a fence raised from a lower token, on the SQL
// endpoint and on POST /v1/transactions. Who is open when is shown by promise states and
// pg_stat_activity, never by durations.
import { expect } from 'vitest';
import type pg from 'pg';
import { sqlTest } from '../support/fixtures.ts';
import { fenceOptions, fenceRow, type SqlProxy } from '../support/sql.ts';
import { pollUntil, settled } from '../support/locks.ts';

const test = sqlTest
  // A's statement on /v1/transactions waits (without a lock) for the test: no statement timeout cuts it short.
  .extend('sqlEnv', { scope: 'file' }, { FENCEPOST_TX_STATEMENT_TIMEOUT_MS: '60000' })
  .extend('clientTables', { scope: 'file' }, [
    { definition: 'public.leader_rows (id int PRIMARY KEY, session text)', privileges: 'SELECT, INSERT' },
  ]);

const TOKEN = 7;
let nextId = 1;

const rowsOf = async (pool: pg.Pool, ids: number[]) =>
  (await pool.query<{ id: number; session: string }>('SELECT id, session FROM public.leader_rows WHERE id = ANY($1) ORDER BY id', [ids]))
    .rows;

async function raiseTo(sql: SqlProxy, fenceKey: string, token: number): Promise<void> {
  const res = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, {
    method: 'PUT',
    headers: { 'fencing-token': String(token) },
  });
  expect(res.status).toBe(200);
}

async function transaction(
  sql: SqlProxy,
  fenceKey: string,
  statements: { sql: string; params?: unknown[] }[],
): Promise<{ status: number; body: unknown }> {
  const res = await fetch(`${sql.proxy.url}/v1/transactions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ fences: [{ key: fenceKey, token: String(TOKEN) }], statements }),
  });
  return { status: res.status, body: await res.json() };
}

const cases = [
  { name: 'a new fence key', seed: null },
  { name: 'a fence at a lower token (the first transaction raises it)', seed: 3 },
] as const;

for (const { name, seed } of cases) {
  test(`SQL endpoint, ${name}: session B of the leader commits while session A's transaction is open, then A commits`, async ({
    db,
    sql,
  }) => {
    const fenceKey = `leader/sql/${seed ?? 'new'}`;
    if (seed !== null) await raiseTo(sql, fenceKey, seed);
    const [a, b] = await Promise.all([1, 2].map(() => sql.connect('leader', { options: fenceOptions(TOKEN, fenceKey) })));
    try {
      const [idA, idB] = [nextId++, nextId++];
      await a!.query('BEGIN');
      await a!.query('INSERT INTO public.leader_rows VALUES ($1, $2)', [idA, 'A']);
      // A is open and holds the fence (it passed it at 7). B, same token and key, writes and commits.
      await b!.query('BEGIN');
      await b!.query('INSERT INTO public.leader_rows VALUES ($1, $2)', [idB, 'B']);
      await b!.query('COMMIT');
      expect(await rowsOf(db.pool, [idA, idB])).toEqual([{ id: idB, session: 'B' }]); // A still open
      await a!.query('COMMIT');
      expect(await rowsOf(db.pool, [idA, idB])).toEqual([
        { id: idA, session: 'A' },
        { id: idB, session: 'B' },
      ]);
      expect(await fenceRow(db.pool, fenceKey)).toEqual({ highest_token: String(TOKEN) });
    } finally {
      await Promise.all([a!.end(), b!.end()]);
    }
  });

  test(`POST /v1/transactions, ${name}: a transaction of the leader commits while another of its transactions runs a long statement`, async ({
    db,
    sql,
  }) => {
    const fenceKey = `leader/tx/${seed ?? 'new'}`;
    if (seed !== null) await raiseTo(sql, fenceKey, seed);
    const lockKey = 7_700 + (seed ?? 0);
    const [idA, idB] = [nextId++, nextId++];
    // The test holds an advisory lock; A's long statement polls for it (pg_try_advisory_xact_lock:
    // no lock wait, so no lock timeout) and ends once the test lets go.
    const gate = await db.pool.connect();
    await gate.query('SELECT pg_advisory_lock($1)', [lockKey]);
    let gateHeld = true;
    try {
      const a = transaction(sql, fenceKey, [
        { sql: 'INSERT INTO public.leader_rows VALUES ($1, $2)', params: [idA, 'A'] },
        {
          sql: 'WITH RECURSIVE w(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM w WHERE NOT pg_try_advisory_xact_lock($1::bigint) AND pg_sleep(0.01) IS NOT NULL) SELECT max(n) AS polls FROM w',
          params: [lockKey],
        },
      ]);
      const aState = settled(a);
      await pollUntil(
        'A running its long statement',
        async () =>
          (
            await db.pool.query(
              `SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'WITH RECURSIVE w(n)%pg_try_advisory_xact_lock%'`,
            )
          ).rowCount
            ? true
            : undefined,
        () => (aState.done ? 'A ended first' : null),
      );
      const b = await transaction(sql, fenceKey, [{ sql: 'INSERT INTO public.leader_rows VALUES ($1, $2)', params: [idB, 'B'] }]);
      expect(b).toMatchObject({ status: 200 });
      expect(aState.done).toBe(false); // B committed while A was open
      await gate.query('SELECT pg_advisory_unlock($1)', [lockKey]);
      gateHeld = false;
      expect(await a).toMatchObject({ status: 200 });
      expect(await rowsOf(db.pool, [idA, idB])).toEqual([
        { id: idA, session: 'A' },
        { id: idB, session: 'B' },
      ]);
      expect(await fenceRow(db.pool, fenceKey)).toEqual({ highest_token: String(TOKEN) });
    } finally {
      if (gateHeld) await gate.query('SELECT pg_advisory_unlock($1)', [lockKey]).catch(() => {});
      gate.release();
    }
  });
}

test('SQL endpoint, a new fence key: 8 sessions of the leader starting at once all hold their transactions open together, and all commit', async ({
  db,
  sql,
}) => {
  // Invariant: the leader's sessions never refuse one another (no 55P03, no FP428): each raise is
  // a short transaction of the proxy's, each writer's transaction only shares the fence.
  const fenceKey = 'leader/sql/at-once';
  const sessions = await Promise.all(Array.from({ length: 8 }, () => sql.connect('leader', { options: fenceOptions(TOKEN, fenceKey) })));
  try {
    const ids = sessions.map(() => nextId++);
    await Promise.all(
      sessions.map(async (s, i) => {
        await s.query('BEGIN');
        await s.query('INSERT INTO public.leader_rows VALUES ($1, $2)', [ids[i], `S${i}`]);
      }),
    );
    await Promise.all(sessions.map((s) => s.query('COMMIT')));
    expect((await rowsOf(db.pool, ids)).length).toBe(8);
    expect(await fenceRow(db.pool, fenceKey)).toEqual({ highest_token: String(TOKEN) });
  } finally {
    await Promise.all(sessions.map((s) => s.end()));
  }
});
