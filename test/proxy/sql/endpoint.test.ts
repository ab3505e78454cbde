// The SQL endpoint in open mode, driven by node-postgres: every transaction of a session with a
// token is fenced inside itself; a session without one reads but never writes; one fence, two doors.
import { describe, expect } from 'vitest';
import pg from 'pg';
import type { TestDatabase } from '../../support/db.ts';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions, fenceRow, sendCancel, type SqlProxy } from '../../support/sql.ts';

const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.items (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT, UPDATE, DELETE' },
]);

const ids = { next: 1 };
const id = () => ids.next++;
const exists = async (db: TestDatabase, n: number) => (await db.pool.query('SELECT 1 FROM public.items WHERE id = $1', [n])).rowCount === 1;
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );
const advanceOverHttp = (sql: SqlProxy, fenceKey: string, token: number) =>
  fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, { method: 'PUT', headers: { 'fencing-token': String(token) } });

describe('a session with a token', () => {
  test('writes in the simple and the extended protocol, and each raises the fence to its token', async ({ sql, db }) => {
    const c = await sql.connect('writer-a', { options: fenceOptions(5, 'a') });
    const [x, y] = [id(), id()];
    await c.query(`INSERT INTO items VALUES (${x}, 'simple')`);
    await c.query('INSERT INTO items VALUES ($1, $2)', [y, 'extended']);
    expect([await exists(db, x), await exists(db, y)]).toEqual([true, true]);
    expect(await fenceRow(db.pool, 'a')).toEqual({ highest_token: '5' });
    await c.end();
  });

  test('is fenced at startup: its token raises the fence before its first statement, and a stale one hears FP409 at its first transaction', async ({
    sql,
    db,
  }) => {
    // connect() resolves at the session's ReadyForQuery, which the endpoint sends once the session
    // is fenced for its startup settings (a pool hands out connections that are ready to write).
    const c = await sql.connect('writer-startup', { options: fenceOptions(6, 'startup') });
    expect(await fenceRow(db.pool, 'startup')).toEqual({ highest_token: '6' });
    const x = id();
    await c.query(`INSERT INTO items VALUES (${x}, 'after startup')`);
    expect(await exists(db, x)).toBe(true);
    const stale = await sql.connect('writer-startup-stale', { options: fenceOptions(4, 'startup') });
    expect(await fenceRow(db.pool, 'startup')).toEqual({ highest_token: '6' });
    expect(await code(stale.query(`INSERT INTO items VALUES (${id()}, 'stale')`))).toBe('FP409');
    await Promise.all([c.end(), stale.end()]);
  });

  test('SHOW answers the token and fence key; SET applies from the next transaction', async ({ sql, db }) => {
    const c = await sql.connect('writer-b', { options: fenceOptions(3, 'b') });
    expect((await c.query('SHOW fencepost.token')).rows[0]).toEqual({ 'fencepost.token': '3' });
    await c.query('BEGIN');
    await c.query("SET fencepost.token = '9'"); // mid-transaction: this transaction keeps token 3
    await c.query(`INSERT INTO items VALUES (${id()}, 'in tx')`);
    await c.query('COMMIT');
    expect(await fenceRow(db.pool, 'b')).toEqual({ highest_token: '3' });
    await c.query(`INSERT INTO items VALUES (${id()}, 'next tx')`);
    expect(await fenceRow(db.pool, 'b')).toEqual({ highest_token: '9' });
    await c.end();
  });

  test('BEGIN ISOLATION LEVEL keeps its isolation and the transaction is fenced', async ({ sql, db }) => {
    const c = await sql.connect('writer-c', { options: fenceOptions(4, 'c') });
    await c.query('BEGIN ISOLATION LEVEL SERIALIZABLE');
    expect((await c.query('SHOW transaction_isolation')).rows[0]).toEqual({ transaction_isolation: 'serializable' });
    await c.query(`INSERT INTO items VALUES (${id()}, 'serializable')`);
    await c.query('COMMIT');
    expect(await fenceRow(db.pool, 'c')).toEqual({ highest_token: '4' });
    await c.end();
  });

  test('a syntax error reports its position in the text the writer sent', async ({ sql }) => {
    const c = await sql.connect('writer-p', { options: fenceOptions(1, 'p') });
    const err = await c.query('SELECT 1 FROM nowhere_at_all').catch((e: { position?: string }) => e);
    expect((err as { position?: string }).position).toBe('15');
    await c.end();
  });
});

describe('a session without a token', () => {
  test('reads, but a write fails with 25006 in either protocol, and RESET or DISCARD ALL change nothing', async ({ sql, db }) => {
    const c = await sql.connect('reader');
    expect((await c.query('SELECT count(*)::int AS n FROM items')).rows[0].n).toBeGreaterThanOrEqual(0);
    const x = id();
    expect(await code(c.query(`INSERT INTO items VALUES (${x}, 'no token')`))).toBe('25006');
    expect(await code(c.query('INSERT INTO items VALUES ($1, $2)', [x, 'no token']))).toBe('25006');
    await c.query('RESET ALL');
    expect(await code(c.query(`INSERT INTO items VALUES (${x}, 'after reset')`))).toBe('25006');
    await c.query('DISCARD ALL');
    expect(await code(c.query('INSERT INTO items VALUES ($1, $2)', [x, 'after discard']))).toBe('25006');
    expect(await exists(db, x)).toBe(false);
    await c.end();
  });

  test("a write's 25006 carries a hint naming fencepost.token, in either protocol", async ({ sql }) => {
    const c = await sql.connect('hinted');
    for (const attempt of [c.query(`INSERT INTO items VALUES (${id()}, 'x')`), c.query('INSERT INTO items VALUES ($1, $2)', [id(), 'x'])]) {
      const err = (await attempt.catch((e: pg.DatabaseError) => e)) as pg.DatabaseError;
      expect(err.code).toBe('25006');
      expect(err.hint).toContain('fencepost.token');
    }
    await c.end();
  });

  test('PREPARE TRANSACTION in a fenced session: 0A000 with a hint saying why two-phase commit is refused; nothing prepared or written', async ({
    sql,
    db,
  }) => {
    // The session's fence is a temporary object its transactions read, so Postgres refuses to
    // prepare them; the writer is told that is the endpoint's doing, not its own temp tables'.
    const c = await sql.connect('two-phase', { options: fenceOptions(3, 'tpc') });
    const x = id();
    await c.query('BEGIN');
    await c.query(`INSERT INTO items VALUES (${x}, 'prepared?')`);
    const err = (await c.query(`PREPARE TRANSACTION 'fencepost_tpc_${x}'`).catch((e: pg.DatabaseError) => e)) as pg.DatabaseError;
    expect(err.code).toBe('0A000');
    expect(err.hint).toContain('two-phase commit');
    expect((await c.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]); // the session goes on
    expect(await exists(db, x)).toBe(false);
    expect((await db.pool.query('SELECT gid FROM pg_prepared_xacts WHERE gid = $1', [`fencepost_tpc_${x}`])).rows).toEqual([]);
    await c.end();
  });

  test('COMMIT in the middle of a Query: what follows is fenced again (see escapes.test.ts), so a current token writes both', async ({
    sql,
    db,
  }) => {
    const c = await sql.connect('writer-m', { options: fenceOptions(2, 'm') });
    const [x, y] = [id(), id()];
    expect(await code(c.query(`INSERT INTO items VALUES (${x}, 'fenced'); COMMIT; INSERT INTO items VALUES (${y}, 'fenced too')`))).toBe(
      'ok',
    );
    expect([await exists(db, x), await exists(db, y)]).toEqual([true, true]);
    await c.end();
  });
});

describe('one fence, two doors', () => {
  test("GC-pause zombie: a new leader advances the fence over HTTP; the old SQL writer's next transaction fails FP409 and nothing of it commits", async ({
    sql,
    db,
  }) => {
    const zombie = await sql.connect('old-leader', { options: fenceOptions(10, 'z') });
    await zombie.query(`INSERT INTO items VALUES (${id()}, 'leader 10')`);
    expect((await advanceOverHttp(sql, 'z', 11)).status).toBe(200);
    const [x, y] = [id(), id()];
    const simple = await zombie.query(`INSERT INTO items VALUES (${x}, 'zombie')`).catch((e: pg.DatabaseError) => e);
    expect(simple).toMatchObject({ code: 'FP409', detail: 'fence key "z", token 10, highest token 11' });
    expect((simple as Error).message).toContain('token 10 is below the highest token 11');
    expect(await code(zombie.query('INSERT INTO items VALUES ($1, $2)', [y, 'zombie']))).toBe('FP409');
    // The proxy answers BEGIN itself; the fence goes with the block's first statement.
    await zombie.query('BEGIN');
    const w = id();
    expect(await code(zombie.query('INSERT INTO items VALUES ($1, $2)', [w, 'zombie']))).toBe('FP409');
    expect((await zombie.query('COMMIT')).command).toBe('ROLLBACK');
    expect([await exists(db, x), await exists(db, y), await exists(db, w)]).toEqual([false, false, false]);
    expect(await fenceRow(db.pool, 'z')).toEqual({ highest_token: '11' });
    await expect
      .poll(
        async () =>
          (
            await db.pool.query(
              "SELECT count(*)::int AS n FROM fencepost.rejections WHERE fence_key = 'z' AND writer_id = 'old-leader' AND token = 10",
            )
          ).rows[0].n,
      )
      .toBe(3);
    await zombie.end();
  });

  test('a BEGIN the proxy answers itself (a Query, or a prepared statement in the extended protocol) is fenced with the first statement of its block', async ({
    sql,
    db,
  }) => {
    // Invariant: the block's fence is checked when its first statement runs, not when the writer's
    // BEGIN was answered: a raise in between makes that statement fail FP409 and nothing commits;
    // with the current token every statement commits at COMMIT.
    const c = await sql.connect('deferred', { options: fenceOptions(40, 'held') });
    // Prepared under a name, only a BEGIN with modes is held (a plain one goes as sent, the fence in front).
    const begins = [() => c.query('BEGIN'), () => c.query({ name: 'begin', text: 'BEGIN ISOLATION LEVEL READ COMMITTED' })];
    await begins[1]!(); // parsed once; the second time it is Bind/Execute/Sync only
    await c.query('ROLLBACK');
    for (const begin of begins) {
      const x = id();
      await begin();
      await c.query('INSERT INTO items VALUES ($1, $2)', [x, 'current']);
      expect((await c.query('COMMIT')).command).toBe('COMMIT');
      expect(await exists(db, x)).toBe(true);
    }
    await begin40ThenRaise(begins[0]!, 41);
    await begin40ThenRaise(begins[1]!, 42);
    async function begin40ThenRaise(begin: () => Promise<unknown>, next: number) {
      await begin();
      // The writer sits after its BEGIN: it holds nothing, so the raise goes through at once.
      expect((await advanceOverHttp(sql, 'held', next)).status).toBe(200);
      const y = id();
      expect(await code(c.query('INSERT INTO items VALUES ($1, $2)', [y, 'stale']))).toBe('FP409');
      expect((await c.query('COMMIT')).command).toBe('ROLLBACK');
      expect(await exists(db, y)).toBe(false);
      await c.query(`SET fencepost.token = '${next}'`);
    }
    expect(await fenceRow(db.pool, 'held')).toEqual({ highest_token: '42' });
    await c.end();
  });

  test('a SQL writer raising the fence locks out an HTTP zombie', async ({ sql }) => {
    const leader = await sql.connect('new-leader', { options: fenceOptions(21, 'h') });
    await leader.query(`INSERT INTO items VALUES (${id()}, 'leader 21')`);
    const res = await advanceOverHttp(sql, 'h', 20);
    expect(res.status).toBe(409);
    await leader.end();
  });

  test('an explicit transaction that went stale while open commits nothing', async ({ sql, db }) => {
    const old = await sql.connect('slow', { options: fenceOptions(30, 's') });
    await old.query('BEGIN');
    const x = id();
    await old.query(`INSERT INTO items VALUES (${x}, 'open')`);
    // The raise waits for the open transaction's shared lock: it is not lost, it comes after.
    const raise = advanceOverHttp(sql, 's', 31);
    await new Promise((r) => setTimeout(r, 100));
    await old.query('COMMIT');
    expect((await raise).status).toBe(200);
    expect(await exists(db, x)).toBe(true); // committed under token 30, before the raise
    expect(await code(old.query(`INSERT INTO items VALUES (${id()}, 'late')`))).toBe('FP409');
    await old.end();
  });
});

describe('the session', () => {
  test("names the proxy's database or is refused with 3D000", async ({ sql }) => {
    const c = new pg.Client({ connectionString: sql.url('w').replace(`/${sql.database}`, '/other_db') });
    expect(await code(c.connect())).toBe('3D000');
  });

  test('SET ROLE to a role it is not a member of is refused', async ({ sql }) => {
    const c = await sql.connect('w', { options: fenceOptions(1, 'r') });
    expect(await code(c.query('SET ROLE postgres'))).toMatch(/^(42501|22023)$/);
    await c.end();
  });

  test('a cancel request reaches the backend of the session', async ({ sql }) => {
    const c = await sql.connect('w');
    const sleeping = code(c.query('SELECT pg_sleep(10)'));
    await new Promise((r) => setTimeout(r, 200));
    sendCancel(sql.port, c);
    expect(await sleeping).toBe('57014');
    await c.end();
  });

  test('the backend dying mid-transaction fails the session and commits nothing; the endpoint serves on', async ({ sql, db }) => {
    const c = await sql.connect('doomed', { options: fenceOptions(1, 'd') });
    await c.query('BEGIN');
    const x = id();
    await c.query(`INSERT INTO items VALUES (${x}, 'doomed')`);
    const pid = (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    await db.pool.query('SELECT pg_terminate_backend($1)', [pid]);
    expect(await code(c.query('COMMIT'))).not.toBe('ok');
    expect(await exists(db, x)).toBe(false);
    const again = await sql.connect('survivor');
    expect((await again.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    await again.end();
  });

  test('a storm of 500 connections: some are refused with 53300, none crash the endpoint', async ({ sql }) => {
    const results = await Promise.all(
      Array.from({ length: 500 }, async (_, i) => {
        const c = new pg.Client({ connectionString: sql.url(`storm-${i}`) });
        c.on('error', () => {});
        try {
          await c.connect();
          await c.query('SELECT 1');
          return 'ok';
        } catch (e) {
          return (e as { code?: string }).code ?? 'error';
        } finally {
          await c.end().catch(() => {});
        }
      }),
    );
    expect(results.filter((r) => r === 'ok').length).toBeGreaterThan(50);
    expect([...new Set(results)].sort()).toEqual(expect.arrayContaining(['ok']));
    expect(results.filter((r) => r !== 'ok' && r !== '53300')).toEqual([]);
    const c = await sql.connect('after-storm');
    expect((await c.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    await c.end();
  }, 60_000);
});
