// POST /v1/transactions: fences and statements in one transaction, all or nothing, as the key's role.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { SECRET, adminQuery, bearer, securedApp, uniqueRole } from '../../support/keys.ts';
import { testApp } from '../../support/proxy.ts';

let db: TestDatabase;
let app: FastifyInstance;
const role = uniqueRole('tx');

beforeAll(async () => {
  db = await createTestDatabase();
  await adminQuery(`CREATE ROLE ${role} NOLOGIN`);
  await db.pool.query(`
    CREATE SCHEMA app;
    CREATE TABLE app.orders (id int PRIMARY KEY, total int NOT NULL CHECK (total >= 0));
    CREATE TABLE app.secret (x int);
    CREATE TABLE app.counters (id text PRIMARY KEY, n int NOT NULL);
    INSERT INTO app.counters VALUES ('x', 0), ('y', 0);
    GRANT USAGE ON SCHEMA app TO ${role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON app.orders, app.counters TO ${role};
    -- Not SECURITY DEFINER: it switches the caller back to the login role, as RESET ROLE would.
    CREATE FUNCTION app.escape() RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config('role', session_user, true) $$;
    GRANT EXECUTE ON FUNCTION app.escape() TO ${role};
  `);
  app = securedApp(db.pool, role);
  await app.ready();
});
afterAll(async () => {
  await app.close();
  await db.drop();
  await adminQuery(`DROP ROLE IF EXISTS ${role}`);
});

/** securedApp's transaction settings with a statement timeout no loaded box reaches, for tests of something else. */
function patientTransactions() {
  return { clientRole: clientRoleFor(db.pool), maxStatements: 8, statementTimeoutMs: 30_000, retries: 3 };
}

type Fence = { key: string; token: string };
type Stmt = { sql: string; params?: unknown[] };

async function post(
  fences: Fence[],
  statements: Stmt[],
  key = SECRET.writer,
  extra: Record<string, unknown> = {},
  to: FastifyInstance = app,
) {
  const res = await to.inject({
    method: 'POST',
    url: '/v1/transactions',
    headers: { ...bearer(key), 'content-type': 'application/json', 'writer-id': 'tx-test' },
    payload: JSON.stringify({ fences, statements, ...extra }),
  });
  return { status: res.statusCode, body: res.json() };
}

async function orders(): Promise<{ id: number; total: number }[]> {
  return (await db.pool.query('SELECT id, total FROM app.orders ORDER BY id')).rows;
}
async function fence(key: string) {
  await app.fence.flushCounts(); // accepted counts reach Postgres in batches (accepted-counts.ts)
  const { rows } = await db.pool.query('SELECT highest_token, accepted, rejected FROM fencepost.fence_stats WHERE fence_key = $1', [key]);
  return rows[0] ?? null;
}

describe('commit', () => {
  test('statements and fence raises commit together, with rows and row counts per statement', async () => {
    const r = await post(
      [
        { key: 'w/a', token: '5' },
        { key: 'shared/b', token: '7' },
      ],
      [
        { sql: 'INSERT INTO app.orders VALUES ($1, $2), ($3, $4)', params: [1, 10, 2, 20] },
        { sql: 'SELECT id, total, current_user AS who FROM app.orders ORDER BY id' },
      ],
    );
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.results[0]).toEqual({ rowCount: 2, rows: [] });
    expect(r.body.results[1]).toEqual({
      rowCount: 2,
      rows: [
        { id: 1, total: 10, who: role },
        { id: 2, total: 20, who: role },
      ],
    });
    expect(await fence('w/a')).toEqual({ highest_token: '5', accepted: '1', rejected: '0' });
    expect(await fence('shared/b')).toEqual({ highest_token: '7', accepted: '1', rejected: '0' });
  });

  test('bigint, bytea, timestamps and odd column names come back as JSON-safe values', async () => {
    const r = await post(
      [{ key: 'w/a', token: '5' }],
      [
        {
          sql: `SELECT 9223372036854775807::bigint AS big, '\\xdead'::bytea AS b, '2026-01-02 03:04:05.123456+00'::timestamptz AT TIME ZONE 'UTC' AS t, 1 AS "__proto__"`,
        },
      ],
    );
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.results[0].rows[0]).toEqual({
      big: '9223372036854775807',
      b: '\\xdead',
      t: '2026-01-02 03:04:05.123456',
      ['__proto__']: 1,
    });
  });
});

describe('isolation', () => {
  test.each(['read committed', 'repeatable read', 'serializable'])(
    'isolation %s: 200, and the statements run at that level',
    async (isolation) => {
      const r = await post(
        [{ key: 'w/iso', token: '1' }],
        [{ sql: `SELECT current_setting('transaction_isolation') AS iso` }],
        SECRET.writer,
        { isolation },
      );
      expect(r.status).toBe(200);
      expect(r.body.results[0].rows).toEqual([{ iso: isolation }]);
    },
  );
});

describe('all or nothing', () => {
  test('a stale token on one fence answers 409 stale_token and applies nothing, not even the other fence', async () => {
    const before = await orders();
    const r = await post(
      [
        { key: 'w/a', token: '4' },
        { key: 'w/fresh', token: '100' },
      ],
      [{ sql: 'INSERT INTO app.orders VALUES (50, 1)' }],
    );
    expect(r.status).toBe(409);
    expect(r.body).toMatchObject({ error: 'stale_token', fenceKey: 'w/a', token: '4', highestToken: '5' });
    expect(await orders()).toEqual(before);
    expect(await fence('w/fresh')).toBeNull();
    // Counted like any fenced write: one rejection on the fence that refused.
    expect(await fence('w/a')).toMatchObject({ accepted: '2', rejected: '1' });
    const log = await db.pool.query(`SELECT operation, token, highest_token, writer_id FROM fencepost.rejections WHERE fence_key = 'w/a'`);
    expect(log.rows).toEqual([{ operation: 'transaction', token: '4', highest_token: '5', writer_id: 'tx-test' }]);
  });

  test("a failing later statement undoes the earlier ones; the raise, a statement of the proxy's own before the transaction, stays (uncounted)", async () => {
    const before = await orders();
    const r = await post([{ key: 'w/undo', token: '3' }], [{ sql: 'INSERT INTO app.orders VALUES (60, 1)' }, { sql: 'SELECT 1/0' }]);
    expect(r.status).toBe(400);
    expect(r.body).toMatchObject({ error: 'sql_error', sqlState: '22012', statement: 1 });
    expect(await orders()).toEqual(before);
    expect(await fence('w/undo')).toEqual({ highest_token: '3', accepted: '0', rejected: '0' });
  });

  test.each([
    ['syntax error', 'SELEC 1', [], 400, 'sql_error', '42601'],
    ['undefined table', 'SELECT * FROM app.nope', [], 400, 'sql_error', '42P01'],
    ['data exception', "SELECT 'x'::int", [], 400, 'sql_error', '22P02'],
    ['wrong parameter count', 'SELECT $1::int + $2::int', [1], 400, 'sql_error', '08P01'],
    ['two statements in one entry', 'SELECT 1; SELECT 2', [], 400, 'sql_error', '42601'],
    ['unique violation', 'INSERT INTO app.orders VALUES (1, 1)', [], 409, 'sql_conflict', '23505'],
    ['check violation', 'UPDATE app.orders SET total = -1', [], 409, 'sql_conflict', '23514'],
    ['no privilege', 'SELECT * FROM app.secret', [], 403, 'sql_permission_denied', '42501'],
    ['statement timeout', 'SELECT pg_sleep(1)', [], 504, 'sql_timeout', '57014'],
  ])('%s: status by SQLSTATE class, nothing of the transaction applied', async (_what, sql, params, status, code, sqlState) => {
    const before = await orders();
    const r = await post([{ key: 'w/cls', token: '1' }], [{ sql: 'INSERT INTO app.orders VALUES (70, 1)' }, { sql, params }]);
    expect(r.status, JSON.stringify(r.body)).toBe(status);
    expect(r.body).toMatchObject({ error: code, sqlState, statement: 1 });
    expect(await orders()).toEqual(before);
    // The raise to the transaction's token came first, in a statement of its own.
    expect(await fence('w/cls')).toMatchObject({ highest_token: '1', accepted: '0' });
  });
});

describe('the key and its role', () => {
  test.each([
    ['COMMIT', 'COMMIT'],
    ['RESET ROLE behind comments', '/* a /* nested */ comment */ -- line\n  reset role'],
    ['SET ROLE', 'SET ROLE postgres'],
    ['set_config', "SELECT set_config('statement_timeout', '0', true)"],
    ['DO block', "DO $$ BEGIN EXECUTE 'RESET ROLE'; END $$"],
    ['SAVEPOINT', 'SAVEPOINT s'],
  ])('%s is refused before anything runs: 400 statement_not_allowed', async (_what, sql) => {
    const r = await post([{ key: 'w/ctl', token: '1' }], [{ sql }]);
    expect(r.status).toBe(400);
    expect(r.body.error).toBe('statement_not_allowed');
    expect(await fence('w/ctl')).toBeNull();
  });

  test('statements that switch back to the login role through a function end up with no privilege: 403 sql_permission_denied, nothing applied', async () => {
    const before = await orders();
    const r = await post(
      [{ key: 'w/esc', token: '1' }],
      [{ sql: 'SELECT app.escape()' }, { sql: 'INSERT INTO app.orders VALUES (80, 1)' }],
    );
    expect(r.status).toBe(403);
    expect(r.body).toMatchObject({ error: 'sql_permission_denied', statement: 1 });
    expect(await orders()).toEqual(before);
    expect(await fence('w/esc')).toMatchObject({ highest_token: '1', accepted: '0' });
  });

  test("a key without pgRole, a read-only key, or a fence outside the key's prefixes gets 403 forbidden", async () => {
    expect((await post([{ key: 'w/k', token: '1' }], [{ sql: 'SELECT 1' }], SECRET.norole)).body.error).toBe('forbidden');
    expect((await post([{ key: 'w/k', token: '1' }], [{ sql: 'SELECT 1' }], SECRET.reader)).body.error).toBe('forbidden');
    expect(
      (
        await post(
          [
            { key: 'w/k', token: '1' },
            { key: 'o/k', token: '1' },
          ],
          [{ sql: 'SELECT 1' }],
        )
      ).body.error,
    ).toBe('forbidden');
    expect(await fence('w/k')).toBeNull();
  });

  test('malformed bodies get registry errors: invalid_transaction, invalid_token, token_required, invalid_key, too_many_statements', async () => {
    const raw = async (payload: string | Buffer) =>
      (
        await app.inject({
          method: 'POST',
          url: '/v1/transactions',
          headers: { ...bearer(SECRET.writer), 'content-type': 'application/json' },
          payload,
        })
      ).json().error;
    expect(await raw('')).toBe('invalid_transaction');
    expect(await raw(Buffer.from([0x7b, 0xff, 0x7d]))).toBe('invalid_transaction');
    expect(await raw('{"fences":[{"key":"w/a","token":"1"}],"statements":[{"sql":"SELECT 1"}],"extra":1}')).toBe('invalid_transaction');
    expect(await raw('{"fences":[{"key":"w/a","token":"1"},{"key":"w/a","token":"2"}],"statements":[{"sql":"SELECT 1"}]}')).toBe(
      'invalid_transaction',
    );
    expect(await raw('{"fences":[{"key":"w/a","token":"1"}],"statements":[{"sql":"DELETE FROM app.orders\\u0000 WHERE id = 1"}]}')).toBe(
      'invalid_transaction',
    );
    expect(await raw('{"fences":[{"key":"w/a","token":5}],"statements":[{"sql":"SELECT 1"}]}')).toBe('invalid_token');
    expect(await raw('{"fences":[{"key":"w/a"}],"statements":[{"sql":"SELECT 1"}]}')).toBe('token_required');
    expect(await raw('{"fences":[{"key":"","token":"1"}],"statements":[{"sql":"SELECT 1"}]}')).toBe('invalid_key');
    expect(
      (
        await post(
          [{ key: 'w/a', token: '5' }],
          Array.from({ length: 9 }, () => ({ sql: 'SELECT 1' })),
        )
      ).body.error,
    ).toBe('too_many_statements');
  });
});

describe('concurrency', () => {
  test('transactions naming the same fences in opposite orders never deadlock on them', async () => {
    // Their UPDATEs of one row queue behind each other: on a loaded box a wait can pass the file's
    // 300 ms statement timeout, which is not what this checks, so these run with a patient one.
    const patient = securedApp(db.pool, role, { transactions: patientTransactions() });
    try {
      const runs = Array.from({ length: 12 }, (_, i) =>
        post(
          i % 2
            ? [
                { key: 'w/p', token: '1' },
                { key: 'w/q', token: '1' },
              ]
            : [
                { key: 'w/q', token: '1' },
                { key: 'w/p', token: '1' },
              ],
          [{ sql: `UPDATE app.counters SET n = n + 1 WHERE id = 'x'` }],
          SECRET.writer,
          {},
          patient,
        ),
      );
      const results = await Promise.all(runs);
      expect(results.map((r) => r.status)).toEqual(Array(12).fill(200));
      expect((await db.pool.query(`SELECT n FROM app.counters WHERE id = 'x'`)).rows[0].n).toBe(12);
      await patient.fence.flushCounts();
      expect(await fence('w/p')).toMatchObject({ accepted: '12', rejected: '0' });
    } finally {
      await patient.close();
    }
  });

  test('a deadlock between the statements of two transactions is retried and both commit', async () => {
    // Separate fences, so only the row locks can collide; a tight deadlock_timeout keeps it quick.
    // A fresh app: pooled client connections read the database's settings when they open.
    await db.pool.query(`ALTER DATABASE ${new URL(db.url).pathname.slice(1)} SET deadlock_timeout = '50ms'`);
    // A barrier, so the deadlock happens however slow the box: after its first UPDATE, each
    // transaction says it arrived (nextval: not transactional, seen at once) and waits until the
    // other has arrived too, i.e. holds its first row. A retried one finds the other arrived long ago.
    await db.pool.query(`CREATE SEQUENCE app.arrived_d1; CREATE SEQUENCE app.arrived_d2;
      GRANT USAGE, SELECT ON SEQUENCE app.arrived_d1, app.arrived_d2 TO ${role};
      CREATE FUNCTION app.await_peer(mine text, theirs text) RETURNS void LANGUAGE plpgsql AS $$
      DECLARE arrived boolean;
      BEGIN
        PERFORM nextval(format('app.arrived_%s', mine)::regclass);
        FOR i IN 1..3000 LOOP
          EXECUTE format('SELECT is_called FROM app.arrived_%s', theirs) INTO arrived;
          EXIT WHEN arrived;
          PERFORM pg_sleep(0.01);
        END LOOP;
      END $$;
      GRANT EXECUTE ON FUNCTION app.await_peer(text, text) TO ${role}`);
    const fresh = securedApp(db.pool, role, { transactions: patientTransactions() });
    const slow = async (a: string, b: string, k: string) => {
      const res = await fresh.inject({
        method: 'POST',
        url: '/v1/transactions',
        headers: { ...bearer(SECRET.writer), 'content-type': 'application/json' },
        payload: JSON.stringify({
          fences: [{ key: k, token: '1' }],
          statements: [
            { sql: `UPDATE app.counters SET n = n + 1 WHERE id = $1`, params: [a] },
            { sql: `SELECT app.await_peer('${k.slice(2)}', '${k === 'w/d1' ? 'd2' : 'd1'}')` },
            { sql: `UPDATE app.counters SET n = n + 1 WHERE id = $1`, params: [b] },
          ],
        }),
      });
      return { status: res.statusCode, body: res.json() };
    };
    const before = (await db.pool.query(`SELECT sum(n)::int AS s FROM app.counters`)).rows[0].s;
    const [r1, r2] = await Promise.all([slow('x', 'y', 'w/d1'), slow('y', 'x', 'w/d2')]);
    await fresh.close();
    expect([r1.status, r2.status]).toEqual([200, 200]);
    expect((await db.pool.query(`SELECT sum(n)::int AS s FROM app.counters`)).rows[0].s).toBe(before + 4);
    // …and Postgres did see the deadlock (statistics arrive with a short delay).
    let deadlocks = 0;
    for (let i = 0; i < 40 && deadlocks === 0; i++) {
      await new Promise((r) => setTimeout(r, 50));
      deadlocks = Number(
        (await db.pool.query(`SELECT pg_stat_clear_snapshot(), deadlocks FROM pg_stat_database WHERE datname = current_database()`)).rows[0]
          .deadlocks,
      );
    }
    expect(deadlocks).toBeGreaterThanOrEqual(1);
  });

  test('/v1/stats stays consistent: accepted + rejected on a fence = fenced requests that reached it', async () => {
    await post([{ key: 'w/s', token: '10' }], [{ sql: 'SELECT 1' }]);
    await post([{ key: 'w/s', token: '9' }], [{ sql: 'SELECT 1' }]);
    await app.inject({ method: 'PUT', url: '/v1/fences/w%2Fs', headers: { ...bearer(SECRET.writer), 'fencing-token': '11' } });
    const stats = (await app.inject({ url: '/v1/stats', headers: bearer(SECRET.reader) })).json();
    expect(stats.byFenceKey.find((f: { fenceKey: string }) => f.fenceKey === 'w/s')).toEqual({
      fenceKey: 'w/s',
      highestToken: '11',
      raisedBy: null,
      raisedAt: expect.any(String),
      accepted: 2,
      rejected: 1,
    });
  });
});

describe('counters', () => {
  test('a transaction that creates a fence counts it on a counter row object writes never use (shards 32–63)', async () => {
    // The row stays locked until the transaction ends: on an object write's shard it would make
    // unrelated writes wait (review finding M1).
    const before = (
      await db.pool.query<{ n: string }>('SELECT coalesce(sum(fences), 0)::text AS n FROM fencepost.totals WHERE shard >= 32')
    ).rows[0]!.n;
    const r = await post([{ key: 'w/new-fence-counted', token: '1' }], [{ sql: 'SELECT 1' }]);
    expect(r.status).toBe(200);
    const after = (await db.pool.query<{ n: string }>('SELECT coalesce(sum(fences), 0)::text AS n FROM fencepost.totals WHERE shard >= 32'))
      .rows[0]!.n;
    expect(BigInt(after) - BigInt(before)).toBe(1n);
  });
});

describe('fence rows are protected by the database itself', () => {
  // Open mode: statements run as the proxy's login role, which owns fencepost.fences.
  test('a transaction run as the table owner can neither lower, delete nor truncate a fence', async () => {
    const open = testApp(db.pool);
    try {
      const send = (sql: string) =>
        open.inject({
          method: 'POST',
          url: '/v1/transactions',
          payload: { fences: [{ key: 'tx-owner', token: '1' }], statements: [{ sql, params: [] }] },
        });
      expect((await open.inject({ method: 'PUT', url: '/v1/fences/guarded', headers: { 'fencing-token': '10' } })).statusCode).toBe(200);
      for (const sql of [
        `UPDATE fencepost.fences SET highest_token = 0 WHERE fence_key = 'guarded'`,
        `DELETE FROM fencepost.fences WHERE fence_key = 'guarded'`,
        'TRUNCATE fencepost.fences',
        `UPDATE fencepost.fences SET fence_key = 'renamed' WHERE fence_key = 'guarded'`,
      ]) {
        const res = await send(sql);
        expect(res.statusCode, sql).toBeGreaterThanOrEqual(400);
        expect(res.statusCode, sql).toBeLessThan(500);
        expect(res.json().error, sql).toMatch(/^sql_/);
      }
      expect((await fence('guarded'))?.highest_token).toBe('10');
      expect((await open.inject({ method: 'PUT', url: '/v1/fences/guarded', headers: { 'fencing-token': '1' } })).statusCode).toBe(409);
    } finally {
      await open.close();
    }
  });
});
