// Accepted counts of SQL endpoint transactions: a fenced transaction is counted as accepted on its
// fence when it commits (fence_counts and totals, so GET /v1/fences/:key, /v1/stats and the
// dashboard show it: they add pending_counts, the rows not folded yet), and not when it rolls
// back or fails.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect } from 'vitest';
import type { TestDatabase } from '../../support/db.ts';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions, type SqlProxy } from '../../support/sql.ts';

const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.items (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT, UPDATE, DELETE' },
]);

let nextId = 1;
const id = () => nextId++;
const fence = async (sql: SqlProxy, key: string) => {
  const res = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(key)}`);
  expect(res.status).toBe(200);
  return (await res.json()) as { accepted: number; rejected: number; highestToken: string };
};
/** The accepted total as /v1/stats computes it: the counters plus the transactions not folded yet. */
const totalAccepted = async (db: TestDatabase) =>
  Number(
    (
      await db.pool.query(
        'SELECT ((SELECT coalesce(sum(accepted), 0) FROM fencepost.totals) + (SELECT count(*) FROM fencepost.pending_counts))::text AS n',
      )
    ).rows[0].n,
  );
const folded = async (db: TestDatabase) =>
  Number((await db.pool.query('SELECT coalesce(sum(accepted), 0)::text AS n FROM fencepost.totals')).rows[0].n);
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );

describe('accepted counts of SQL transactions', () => {
  test('N committed transactions (implicit, explicit, extended, several in one Query) count +N; rolled back or failed ones do not', async ({
    sql,
    db,
  }) => {
    const c = await sql.connect('counter', { options: fenceOptions(2, 'count/a') });
    const before = await totalAccepted(db);
    await c.query(`INSERT INTO items VALUES (${id()}, 'implicit')`); // 1
    await c.query('INSERT INTO items VALUES ($1, $2)', [id(), 'extended']); // 2
    await c.query('BEGIN');
    await c.query(`INSERT INTO items VALUES (${id()}, 'explicit')`);
    await c.query('COMMIT'); // 3
    await c.query(`INSERT INTO items VALUES (${id()}, 'one'); COMMIT; INSERT INTO items VALUES (${id()}, 'two')`); // 4, 5
    await c.query('SELECT 1'); // a read is a fenced transaction too: 6
    expect(await fence(sql, 'count/a')).toMatchObject({ accepted: 6, rejected: 0, highestToken: '2' });
    expect(await totalAccepted(db)).toBe(before + 6);

    await c.query('BEGIN');
    await c.query(`INSERT INTO items VALUES (${id()}, 'rolled back')`);
    await c.query('ROLLBACK');
    const dup = id();
    await c.query(`INSERT INTO items VALUES (${dup}, 'first')`); // 7
    expect(await code(c.query(`INSERT INTO items VALUES (${dup}, 'duplicate')`))).toBe('23505');
    await c.query('BEGIN');
    expect(await code(c.query('SELECT 1/0'))).toBe('22012');
    await c.query('COMMIT'); // of a failed transaction: a rollback
    expect(await fence(sql, 'count/a')).toMatchObject({ accepted: 7, rejected: 0 });
    expect(await totalAccepted(db)).toBe(before + 7);
    await c.end();
  });

  test('a stale transaction counts as rejected, not accepted; a session without a token counts nothing', async ({ sql, db }) => {
    const c = await sql.connect('stale-counter', { options: fenceOptions(1, 'count/b') });
    await c.query('SELECT 1'); // accepted: 1
    await db.pool.query("UPDATE fencepost.fences SET highest_token = 3 WHERE fence_key = 'count/b'");
    expect(await code(c.query(`INSERT INTO items VALUES (${id()}, 'stale')`))).toBe('FP409');
    const reader = await sql.connect('reader');
    await reader.query('SELECT 1');
    await reader.end();
    let f = await fence(sql, 'count/b');
    for (let i = 0; i < 100 && f.rejected === 0; i++) {
      await sleep(50); // recorded after the reply
      f = await fence(sql, 'count/b');
    }
    expect(f).toMatchObject({ accepted: 1, rejected: 1 });
    await c.end();
  });

  test('a session that makes its transaction read-only after writing commits, and is counted', async ({ sql, db }) => {
    const c = await sql.connect('ro-counter', { options: fenceOptions(1, 'count/c') });
    const x = id();
    await c.query('BEGIN');
    await c.query(`INSERT INTO items VALUES (${x}, 'then read only')`);
    await c.query('SET TRANSACTION READ ONLY');
    await c.query('COMMIT');
    expect((await db.pool.query('SELECT 1 FROM items WHERE id = $1', [x])).rowCount).toBe(1);
    expect(await fence(sql, 'count/c')).toMatchObject({ accepted: 1 });
    await c.end();
  });

  // Invariant: each committed transaction is counted exactly once: the proxy adds its counts to
  // the counters in batches (src/fence/accepted-counts.ts), on its own timer, never twice.
  test('the proxy adds every committed transaction to the counters exactly once, by itself', async ({ sql, db }) => {
    const sessions = await Promise.all(
      Array.from({ length: 8 }, (_, i) => sql.connect(`fold-${i}`, { options: fenceOptions(1, 'count/fold') })),
    );
    const before = await totalAccepted(db);
    await Promise.all(
      sessions.map(async (c) => {
        for (let i = 0; i < 25; i++) await c.query(`INSERT INTO items VALUES (${id()}, 'fold')`);
      }),
    );
    await expect.poll(() => totalAccepted(db), { timeout: 15_000, interval: 100 }).toBe(before + 200);
    for (const c of sessions.slice(0, 2)) await c.query(`INSERT INTO items VALUES (${id()}, 'timer')`);
    await Promise.all(sessions.map((c) => c.end()));
    await expect.poll(() => totalAccepted(db), { timeout: 15_000, interval: 100 }).toBe(before + 202);
    expect(await folded(db)).toBe(await totalAccepted(db)); // none of it went through pending_counts
    expect(await fence(sql, 'count/fold')).toMatchObject({ accepted: 202, rejected: 0 });
  });
});
