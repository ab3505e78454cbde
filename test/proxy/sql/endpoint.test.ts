// The SQL endpoint in open mode, driven by node-postgres: a connection with a token is fenced once,
// at startup (its token raising the fence where it is below; a stale one refused), then relayed as
// sent; a newer leader's raise through either door ends it (its next statement is answered FP409,
// then it closes) and nothing of its open transaction lands. A session without a token starts read-only, and a protected table refuses it
// whatever it does. One fence, two doors.
import { describe, expect } from 'vitest';
import pg from 'pg';
import { clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions, fenceRow, sendCancel, type SqlProxy } from '../../support/sql.ts';
import { protectTable } from '../../../src/fence/protect.ts';

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
/** A table protected by `fenceKey` (made once per fence key), granted to the client login: `public.guarded_<key>`. */
const guarded = async (db: TestDatabase, fenceKey: string) => {
  const table = `public.guarded_${fenceKey.replace(/\W/g, '_')}`;
  await db.pool.query(`CREATE TABLE ${table} (id int PRIMARY KEY, v text)`);
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ${table} TO ${clientRoleFor(db.url)}`);
  await protectTable(db.pool, table, fenceKey);
  return table;
};
const inTable = async (db: TestDatabase, table: string, n: number) =>
  (await db.pool.query(`SELECT 1 FROM ${table} WHERE id = $1`, [n])).rowCount === 1;
const staleRejections = async (db: TestDatabase, fenceKey: string, writerId: string) =>
  (
    await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM fencepost.rejections WHERE fence_key = $1 AND writer_id = $2', [
      fenceKey,
      writerId,
    ])
  ).rows[0]!.n;

describe('a session with a token', () => {
  test('writes in the simple and the extended protocol; its startup raised the fence to its token', async ({ sql, db }) => {
    const c = await sql.connect('writer-a', { options: fenceOptions(5, 'a') });
    const [x, y] = [id(), id()];
    await c.query(`INSERT INTO items VALUES (${x}, 'simple')`);
    await c.query('INSERT INTO items VALUES ($1, $2)', [y, 'extended']);
    expect([await exists(db, x), await exists(db, y)]).toEqual([true, true]);
    expect(await fenceRow(db.pool, 'a')).toEqual({ highest_token: '5' });
    await c.end();
  });

  test('is fenced at startup: its token raises the fence before its first statement, and a stale token is refused at connect with FP409, recorded', async ({
    sql,
    db,
  }) => {
    // connect() resolves at the session's ReadyForQuery, which the endpoint sends once the connection
    // is fenced for its startup settings (a pool hands out connections that are ready to write).
    const c = await sql.connect('writer-startup', { options: fenceOptions(6, 'startup') });
    expect(await fenceRow(db.pool, 'startup')).toEqual({ highest_token: '6' });
    const x = id();
    await c.query(`INSERT INTO items VALUES (${x}, 'after startup')`);
    expect(await exists(db, x)).toBe(true);
    const stale = new pg.Client({ connectionString: sql.url('writer-startup-stale', { options: fenceOptions(4, 'startup') }) });
    stale.on('error', () => {});
    expect(await stale.connect().catch((e: pg.DatabaseError) => e)).toMatchObject({
      code: 'FP409',
      severity: 'FATAL',
      message: 'stale fencing token: token 4 is below the highest token 6 of fence key "startup"',
      detail: 'fence key "startup", token 4, highest token 6',
    });
    expect(await fenceRow(db.pool, 'startup')).toEqual({ highest_token: '6' });
    await expect.poll(() => staleRejections(db, 'startup', 'writer-startup-stale')).toBe(1);
    // The leader's connection is untouched by the refusal.
    expect((await c.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    await c.end();
  });

  test('SET fencepost.token after startup is accepted but re-fences nothing: a protected table refuses its writes with FP400 until RESET, unprotected ones write as the startup pair', async ({
    sql,
    db,
  }) => {
    const table = await guarded(db, 'b');
    const c = await sql.connect('writer-b', { options: fenceOptions(3, 'b') });
    expect((await c.query('SHOW fencepost.token')).rows[0]).toEqual({ 'fencepost.token': '3' });
    await c.query("SET fencepost.token = '9'");
    expect((await c.query('SHOW fencepost.token')).rows[0]).toEqual({ 'fencepost.token': '9' });
    const [x, y, z] = [id(), id(), id()];
    const refused = await c.query(`INSERT INTO ${table} VALUES (${x}, 'after SET')`).catch((e: pg.DatabaseError) => e);
    expect(refused).toMatchObject({ code: 'FP400' });
    expect((refused as Error).message).toContain('was changed after this connection was fenced');
    await c.query(`INSERT INTO items VALUES (${y}, 'unprotected after SET')`);
    expect(await fenceRow(db.pool, 'b')).toEqual({ highest_token: '3' });
    await c.query('RESET fencepost.token');
    await c.query(`INSERT INTO ${table} VALUES (${z}, 'after RESET')`);
    expect([await inTable(db, table, x), await exists(db, y), await inTable(db, table, z)]).toEqual([false, true, true]);
    expect(await fenceRow(db.pool, 'b')).toEqual({ highest_token: '3' });
    await c.end();
  });

  test("DISCARD ALL ends the connection's fence: a protected table then refuses its writes (55000 or FP403); a new connection writes", async ({
    sql,
    db,
  }) => {
    const table = await guarded(db, 'discard');
    const c = await sql.connect('writer-discard', { options: fenceOptions(2, 'discard') });
    const [x, y, z] = [id(), id(), id()];
    await c.query(`INSERT INTO ${table} VALUES (${x}, 'fenced')`);
    await c.query('DISCARD ALL');
    expect(await code(c.query(`INSERT INTO ${table} VALUES (${y}, 'after DISCARD ALL')`))).toMatch(/^(55000|FP403)$/);
    await c.end();
    const again = await sql.connect('writer-discard', { options: fenceOptions(2, 'discard') });
    await again.query(`INSERT INTO ${table} VALUES (${z}, 'reconnected')`);
    await again.end();
    expect([await inTable(db, table, x), await inTable(db, table, y), await inTable(db, table, z)]).toEqual([true, false, true]);
  });

  test('BEGIN ISOLATION LEVEL reaches Postgres as sent: the block keeps its isolation and commits', async ({ sql, db }) => {
    const c = await sql.connect('writer-c', { options: fenceOptions(4, 'c') });
    await c.query('BEGIN ISOLATION LEVEL SERIALIZABLE');
    expect((await c.query('SHOW transaction_isolation')).rows[0]).toEqual({ transaction_isolation: 'serializable' });
    const x = id();
    await c.query(`INSERT INTO items VALUES (${x}, 'serializable')`);
    await c.query('COMMIT');
    expect(await exists(db, x)).toBe(true);
    expect(await fenceRow(db.pool, 'c')).toEqual({ highest_token: '4' });
    await c.end();
  });

  test('a syntax error reports its position in the text the writer sent', async ({ sql }) => {
    const c = await sql.connect('writer-p', { options: fenceOptions(1, 'p') });
    const err = await c.query('SELECT 1 FROM nowhere_at_all').catch((e: { position?: string }) => e);
    expect((err as { position?: string }).position).toBe('15');
    await c.end();
  });

  test('PREPARE TRANSACTION: refused (0A000) after a protected write, nothing prepared or written; after unprotected writes only, it prepares', async ({
    sql,
    db,
  }) => {
    // The connection's fence is a temporary object a protected table's trigger reads, so Postgres
    // refuses to prepare such a transaction. One that wrote only unprotected tables prepares (the
    // test cluster has max_prepared_transactions > 0): rolled back here so the database can go.
    const table = await guarded(db, 'tpc');
    const c = await sql.connect('two-phase', { options: fenceOptions(3, 'tpc') });
    const [x, y] = [id(), id()];
    await c.query('BEGIN');
    await c.query(`INSERT INTO ${table} VALUES (${x}, 'prepared?')`);
    const err = (await c.query(`PREPARE TRANSACTION 'fencepost_tpc_${x}'`).catch((e: pg.DatabaseError) => e)) as pg.DatabaseError;
    expect(err.code).toBe('0A000');
    expect(err.message).toContain('temporary objects');
    expect((await c.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]); // the session goes on
    expect(await inTable(db, table, x)).toBe(false);
    expect((await db.pool.query('SELECT gid FROM pg_prepared_xacts WHERE gid = $1', [`fencepost_tpc_${x}`])).rows).toEqual([]);
    const gid = `fencepost_tpc_${y}`;
    try {
      await c.query('BEGIN');
      await c.query(`INSERT INTO items VALUES (${y}, 'prepared')`);
      await c.query(`PREPARE TRANSACTION '${gid}'`);
      expect((await db.pool.query('SELECT gid FROM pg_prepared_xacts WHERE gid = $1', [gid])).rows).toEqual([{ gid }]);
    } finally {
      await db.pool.query(`ROLLBACK PREPARED '${gid}'`).catch(() => {});
    }
    expect(await exists(db, y)).toBe(false);
    await c.end();
  });

  test('COMMIT in the middle of a Query: the connection stays fenced, so both statements write', async ({ sql, db }) => {
    const c = await sql.connect('writer-m', { options: fenceOptions(2, 'm') });
    const [x, y] = [id(), id()];
    expect(await code(c.query(`INSERT INTO items VALUES (${x}, 'fenced'); COMMIT; INSERT INTO items VALUES (${y}, 'fenced too')`))).toBe(
      'ok',
    );
    expect([await exists(db, x), await exists(db, y)]).toEqual([true, true]);
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

  test("its 25006 is Postgres's own; lifting read-only writes an unprotected table as straight to Postgres, but a protected table refuses it with FP403", async ({
    sql,
    db,
  }) => {
    const table = await guarded(db, 'tokenless');
    const c = await sql.connect('lifter');
    const err = (await c.query(`INSERT INTO items VALUES (${id()}, 'x')`).catch((e: pg.DatabaseError) => e)) as pg.DatabaseError;
    expect(err.code).toBe('25006');
    expect(err.hint).toBeUndefined(); // no hint of the proxy's
    await c.query('SET default_transaction_read_only = off');
    const [x, y, z] = [id(), id(), id()];
    await c.query(`INSERT INTO items VALUES (${x}, 'lifted')`);
    expect(await code(c.query(`INSERT INTO ${table} VALUES (${y}, 'lifted')`))).toBe('FP403');
    await c.query('BEGIN READ WRITE');
    expect(await code(c.query('INSERT INTO ' + table + ' VALUES ($1, $2)', [z, 'read write']))).toBe('FP403');
    await c.query('ROLLBACK');
    expect([await exists(db, x), await inTable(db, table, y), await inTable(db, table, z)]).toEqual([true, false, false]);
    await c.end();
  });
});

describe('one fence, two doors', () => {
  test("GC-pause zombie: a new leader raises the fence over HTTP; the old SQL writer's next statement is answered FP409, its connection closes, nothing of it lands", async ({
    sql,
    db,
  }) => {
    const zombie = await sql.connect('old-leader', { options: fenceOptions(10, 'z') });
    await zombie.query(`INSERT INTO items VALUES (${id()}, 'leader 10')`);
    expect((await advanceOverHttp(sql, 'z', 11)).status).toBe(200);
    // Idle when the raise ended its connection: its next request is answered (an ERROR with a
    // ReadyForQuery, so every driver keeps the SQLSTATE), then the connection closes.
    const x = id();
    const err = await zombie.query(`INSERT INTO items VALUES (${x}, 'zombie')`).catch((e: pg.DatabaseError) => e);
    expect(err).toMatchObject({ code: 'FP409', detail: 'fence key "z", token 10, highest token 11' });
    expect((err as Error).message).toBe(
      'stale fencing token: a newer leader raised fence key "z" to token 11, above this connection\'s token 10',
    );
    // The connection is gone: nothing more goes through it.
    const y = id();
    expect(await code(zombie.query('INSERT INTO items VALUES ($1, $2)', [y, 'zombie']))).not.toBe('ok');
    expect([await exists(db, x), await exists(db, y)]).toEqual([false, false]);
    expect(await fenceRow(db.pool, 'z')).toEqual({ highest_token: '11' });
    await expect.poll(() => staleRejections(db, 'z', 'old-leader')).toBe(1);
    await zombie.end().catch(() => {});
    // Reconnecting with the new token writes.
    const leader = await sql.connect('new-leader', { options: fenceOptions(11, 'z') });
    const w = id();
    await leader.query(`INSERT INTO items VALUES (${w}, 'leader 11')`);
    expect(await exists(db, w)).toBe(true);
    await leader.end();
  });

  test('a SQL writer raising the fence locks out an HTTP zombie', async ({ sql }) => {
    const leader = await sql.connect('new-leader', { options: fenceOptions(21, 'h') });
    await leader.query(`INSERT INTO items VALUES (${id()}, 'leader 21')`);
    const res = await advanceOverHttp(sql, 'h', 20);
    expect(res.status).toBe(409);
    await leader.end();
  });

  test("a transaction open when a new leader's SQL connection raises the fence is ended: its COMMIT is answered FP409, nothing of it lands, protected or not", async ({
    sql,
    db,
  }) => {
    // The raise waits a while (FENCEPOST_RAISE_WAIT_MS) for the transaction, which does not end,
    // then ends its connection before it commits; the new leader's connect resolves after that.
    const table = await guarded(db, 'open');
    const old = await sql.connect('open-old', { options: fenceOptions(30, 'open') });
    const [x, y, z] = [id(), id(), id()];
    await old.query('BEGIN');
    await old.query(`INSERT INTO items VALUES (${x}, 'open')`);
    await old.query(`INSERT INTO ${table} VALUES (${y}, 'open')`);
    const leader = await sql.connect('open-new', { options: fenceOptions(31, 'open') });
    expect(await fenceRow(db.pool, 'open')).toEqual({ highest_token: '31' });
    expect(await old.query('COMMIT').catch((e: pg.DatabaseError) => e)).toMatchObject({
      code: 'FP409',
      detail: 'fence key "open", token 30, highest token 31',
    });
    expect([await exists(db, x), await inTable(db, table, y)]).toEqual([false, false]);
    await leader.query(`INSERT INTO ${table} VALUES (${z}, 'leader 31')`);
    expect(await inTable(db, table, z)).toBe(true);
    await Promise.all([leader.end(), old.end().catch(() => {})]);
  });

  test('a transaction that commits while the raise waits for it lands under its token; its next statement is answered FP409', async ({
    sql,
    db,
  }) => {
    const old = await sql.connect('slow', { options: fenceOptions(30, 's') });
    await old.query('BEGIN');
    const x = id();
    await old.query(`INSERT INTO items VALUES (${x}, 'open')`);
    // The raise waits for the transaction open when it began: the COMMIT sent right after it goes through.
    const raise = advanceOverHttp(sql, 's', 31);
    expect((await old.query('COMMIT')).command).toBe('COMMIT');
    expect((await raise).status).toBe(200);
    expect(await exists(db, x)).toBe(true); // committed under token 30, before the raise
    const late = id();
    expect(await code(old.query(`INSERT INTO items VALUES (${late}, 'late')`))).toBe('FP409');
    expect(await exists(db, late)).toBe(false);
    await old.end().catch(() => {});
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
