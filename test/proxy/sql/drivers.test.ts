// Drivers nobody here wrote, through the SQL endpoint and straight to Postgres side by side:
// postgres.js, Drizzle on postgres.js, node-postgres, TypeORM and Sequelize (both on node-postgres)
// and pgx (Go). Invariant: after startup the endpoint only relays, so a driver gets through it the
// answers it gets from Postgres itself with the same startup settings. To Postgres,
// `-c fencepost.token=… -c fencepost.fence_key=…` are plain custom settings, and a tokenless
// endpoint session is a session with default_transaction_read_only=on (DIRECT_TOKENLESS).
import { execFile } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import postgres from 'postgres';
import { drizzle } from 'drizzle-orm/postgres-js';
import { sql as drizzleSql } from 'drizzle-orm';
import 'reflect-metadata';
import { DataSource } from 'typeorm';
import { QueryTypes, Sequelize, Transaction } from 'sequelize';
import { afterAll, describe, expect } from 'vitest';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions, raiseFence as raise } from '../../support/sql.ts';
import type { TestDatabase } from '../../support/db.ts';

const run = promisify(execFile);
const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.driver_rows (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
]);

/** What a tokenless endpoint session is, straight to Postgres. */
const DIRECT_TOKENLESS = '-c default_transaction_read_only=on';

/** A URL straight to Postgres (the test database's superuser) with startup `options`. */
function directUrl(db: TestDatabase, options: string): string {
  const u = new URL(db.url);
  if (options !== '') u.searchParams.set('options', options);
  return u.toString();
}

const landed = async (db: TestDatabase, id: number) =>
  (await db.pool.query<{ v: string }>('SELECT v FROM public.driver_rows WHERE id = $1', [id])).rows[0]?.v ?? null;

/** A step's answer, or the SQLSTATE (or message) it failed with: a failure shows in the comparison. */
async function answer<T>(work: () => Promise<T>): Promise<T | { error: string }> {
  try {
    return await work();
  } catch (err) {
    // Drizzle wraps the driver's error as `cause`, Sequelize as `parent`.
    type Failure = { code?: string; message?: string; cause?: Failure; parent?: Failure };
    const e = err as Failure;
    return { error: e.code ?? e.cause?.code ?? e.parent?.code ?? e.message ?? String(err) };
  }
}

describe('postgres.js', () => {
  /** SHOW, SET and RESET ALL, each followed by ordinary queries; answers as postgres.js returns them. */
  async function settingsRoundTrip(url: string, options: string, prepare: boolean, id: number) {
    const sql = postgres(url, { max: 1, prepare, onnotice: () => {}, connection: options === '' ? {} : { options } });
    const result = (rows: postgres.RowList<postgres.Row[]>) => ({ command: rows.command, count: rows.count, rows: [...rows] });
    try {
      const out = [];
      out.push(await answer(async () => result(await sql`SELECT ${1}::int + 1 AS n`)));
      out.push(await answer(async () => result(await sql`SHOW work_mem`)));
      out.push(await answer(async () => result(await sql`SET work_mem = '7MB'`)));
      out.push(await answer(async () => result(await sql`SHOW work_mem`)));
      out.push(await answer(async () => result(await sql`SELECT ${'after SET'}::text AS t`)));
      out.push(await answer(async () => result(await sql`RESET ALL`)));
      out.push(await answer(async () => result(await sql`SHOW work_mem`)));
      out.push(await answer(async () => result(await sql`SHOW default_transaction_read_only`)));
      out.push(await answer(async () => result(await sql`SELECT ${'after RESET ALL'}::text AS t`)));
      out.push(await answer(async () => result(await sql`INSERT INTO public.driver_rows VALUES (${id}, 'postgres.js') RETURNING v`)));
      return out;
    } finally {
      await sql.end({ timeout: 5 });
    }
  }

  for (const prepare of [true, false]) {
    test(`prepare: ${prepare}: SHOW, SET and RESET ALL answer as straight to Postgres, and every later query still works`, async ({
      db,
      sql,
    }) => {
      const id = prepare ? 100 : 110;
      const options = fenceOptions(1, `drivers/postgres-js-${prepare}`);
      const direct = await settingsRoundTrip(directUrl(db, options), options, prepare, id);
      expect(direct.at(-1)).toEqual({ command: 'INSERT', count: 1, rows: [{ v: 'postgres.js' }] }); // the workload itself is sound
      await db.pool.query('DELETE FROM public.driver_rows WHERE id = $1', [id]);
      expect(await settingsRoundTrip(sql.url('postgres-js'), options, prepare, id)).toEqual(direct);
      expect(await landed(db, id)).toBe('postgres.js');
    });
  }

  test('a tokenless session: SHOW, SET and RESET ALL answer as a read-only session straight to Postgres', async ({ db, sql }) => {
    const direct = await settingsRoundTrip(directUrl(db, DIRECT_TOKENLESS), DIRECT_TOKENLESS, true, 120);
    expect(direct.at(-1)).toEqual({ error: '25006' });
    expect(await settingsRoundTrip(sql.url('postgres-js-reader'), '', true, 120)).toEqual(direct);
    expect(await landed(db, 120)).toBeNull();
  });

  test('a token below the fence is refused at connect with FP409, and nothing lands', async ({ db, sql }) => {
    await raise(sql, 'drivers/postgres-js-stale', 5);
    const stale = postgres(sql.url('postgres-js-stale'), {
      max: 1,
      onnotice: () => {},
      connection: { options: fenceOptions(4, 'drivers/postgres-js-stale') },
    });
    try {
      expect(await answer(() => stale`INSERT INTO public.driver_rows VALUES (130, 'stale')`)).toEqual({ error: 'FP409' });
    } finally {
      await stale.end({ timeout: 5 });
    }
    expect(await landed(db, 130)).toBeNull();
  });

  test("revoked by a newer leader's raise: the next query fails, a new connection gets FP409, and nothing lands", async ({ db, sql }) => {
    const key = 'drivers/postgres-js-revoked';
    const connect = () =>
      postgres(sql.url('postgres-js-old-leader'), { max: 1, onnotice: () => {}, connection: { options: fenceOptions(1, key) } });
    const writer = connect();
    try {
      expect(await answer(async () => [...(await writer`INSERT INTO public.driver_rows VALUES (140, 'before') RETURNING v`)])).toEqual([
        { v: 'before' },
      ]);
      await raise(sql, key, 2);
      // FP409 answers the next query, or reaches the idle connection first and is dropped (postgres.js
      // drops an error no query waits for): the query then sees the connection closed.
      expect([{ error: 'FP409' }, { error: 'CONNECTION_CLOSED' }]).toContainEqual(
        await answer(() => writer`INSERT INTO public.driver_rows VALUES (141, 'after')`),
      );
    } finally {
      // Not another query on this instance: postgres.js reconnects without end for a query queued
      // while its connection closed when each reconnect is refused at startup, straight to Postgres
      // too (seen with a role made NOLOGIN and its backend terminated).
      await writer.end({ timeout: 5 });
    }
    const restarted = connect();
    try {
      expect(await answer(() => restarted`INSERT INTO public.driver_rows VALUES (142, 'restarted')`)).toEqual({ error: 'FP409' });
    } finally {
      await restarted.end({ timeout: 5 });
    }
    expect([await landed(db, 140), await landed(db, 141), await landed(db, 142)]).toEqual(['before', null, null]);
  });
});

describe('node-postgres, revoked', () => {
  test("a newer leader's raise: the session hears FP409, is closed, its backend is gone, and nothing more lands", async ({ db, sql }) => {
    const key = 'drivers/node-postgres-revoked';
    const writer = await sql.connect('node-postgres-old-leader', { options: fenceOptions(1, key) });
    const heard: (string | undefined)[] = [];
    let ended = false;
    writer.on('error', (err) => heard.push((err as { code?: string }).code));
    writer.on('end', () => (ended = true));
    try {
      const { pid } = (
        await writer.query<{ pid: number }>("INSERT INTO public.driver_rows VALUES (150, 'before') RETURNING pg_backend_pid() AS pid")
      ).rows[0]!;
      await raise(sql, key, 2);
      // FP409 reaches the writer as the answer to its next query, or before it, unasked (node-postgres emits 'error').
      const next = await answer(() => writer.query("INSERT INTO public.driver_rows VALUES (151, 'after')"));
      expect([next, ...heard.map((code) => ({ error: code }))]).toContainEqual({ error: 'FP409' });
      await expect.poll(() => ended).toBe(true);
      await expect.poll(async () => (await db.pool.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid])).rowCount).toBe(0);
    } finally {
      await writer.end().catch(() => {});
    }
    expect([await landed(db, 150), await landed(db, 151)]).toEqual(['before', null]);
  });
});

describe('Drizzle on postgres.js', () => {
  /** db.transaction(…, { isolationLevel }): postgres.js sends `begin`, then Drizzle `set transaction …`. */
  async function isolatedTransaction(
    url: string,
    options: string,
    config: { isolationLevel: 'serializable' | 'repeatable read' },
    id: number,
  ) {
    const client = postgres(url, { max: 1, onnotice: () => {}, connection: options === '' ? {} : { options } });
    try {
      const db = drizzle({ client });
      return await answer(() =>
        db.transaction(async (tx) => {
          const [shown] = await tx.execute<{ transaction_isolation: string }>(drizzleSql`SHOW transaction_isolation`);
          await tx.execute(drizzleSql`INSERT INTO public.driver_rows VALUES (${id}, 'drizzle')`);
          return shown?.transaction_isolation;
        }, config),
      );
    } finally {
      await client.end({ timeout: 5 });
    }
  }

  for (const isolationLevel of ['serializable', 'repeatable read'] as const) {
    test(`transaction({ isolationLevel: '${isolationLevel}' }) runs at that level and commits, as straight to Postgres`, async ({
      db,
      sql,
    }) => {
      const id = isolationLevel === 'serializable' ? 200 : 210;
      const options = fenceOptions(1, 'drivers/drizzle');
      expect(await isolatedTransaction(directUrl(db, options), options, { isolationLevel }, id + 1)).toBe(isolationLevel);
      expect(await isolatedTransaction(sql.url('drizzle'), options, { isolationLevel }, id)).toBe(isolationLevel);
      expect(await landed(db, id)).toBe('drizzle');
    });
  }
});

describe('node-postgres', () => {
  /** Named (prepared) SHOWs, the fence's own settings among them, then a named query reused. */
  async function namedShows(connectionString: string, options: string) {
    const c = new pg.Client({ connectionString, options: options === '' ? undefined : options });
    c.on('error', () => {});
    await c.connect();
    const rows = async (q: pg.QueryConfig) => (await c.query(q)).rows;
    try {
      const out = [];
      out.push(await answer(() => rows({ name: 'show-token', text: 'SHOW fencepost.token' })));
      out.push(await answer(() => rows({ name: 'show-read-only', text: 'SHOW transaction_read_only' })));
      out.push(await answer(() => rows({ name: 'show-token', text: 'SHOW fencepost.token' })));
      out.push(await answer(() => rows({ name: 'show-work-mem', text: 'SHOW work_mem' })));
      out.push(await answer(() => rows({ text: "SET work_mem = '7MB'" })));
      out.push(await answer(() => rows({ name: 'show-work-mem', text: 'SHOW work_mem' })));
      out.push(await answer(() => rows({ name: 'one-more', text: 'SELECT $1::int + 1 AS n', values: [41] })));
      out.push(await answer(() => rows({ name: 'one-more', text: 'SELECT $1::int + 1 AS n', values: [1] })));
      out.push(await answer(() => rows({ text: 'SELECT name, statement FROM pg_prepared_statements ORDER BY name' })));
      return out;
    } finally {
      await c.end();
    }
  }

  test('named SHOWs answer, and so does every later named query, as straight to Postgres', async ({ db, sql }) => {
    const options = fenceOptions(1, 'drivers/node-postgres');
    const direct = await namedShows(db.url, options);
    expect(direct[0]).toEqual([{ 'fencepost.token': '1' }]);
    expect(await namedShows(sql.url('node-postgres'), options)).toEqual(direct);
  });

  test('a tokenless session: named SHOWs answer as a read-only session straight to Postgres', async ({ db, sql }) => {
    const direct = await namedShows(db.url, DIRECT_TOKENLESS);
    expect(direct[0]).toEqual({ error: '42704' }); // no such setting without the startup option
    expect(await namedShows(sql.url('node-postgres-reader'), '')).toEqual(direct);
  });
});

describe('TypeORM (node-postgres)', () => {
  /** transaction('SERIALIZABLE'): TypeORM sends START TRANSACTION, then SET TRANSACTION ISOLATION LEVEL. */
  async function serializableTransaction(url: string, options: string, id: number) {
    const source = new DataSource({ type: 'postgres', url, extra: { options, max: 1 }, logging: false });
    await source.initialize();
    try {
      return await answer(() =>
        source.transaction('SERIALIZABLE', async (manager) => {
          const [shown] = (await manager.query('SHOW transaction_isolation')) as { transaction_isolation: string }[];
          await manager.query('INSERT INTO public.driver_rows VALUES ($1, $2)', [id, 'typeorm']);
          return shown?.transaction_isolation;
        }),
      );
    } finally {
      await source.destroy();
    }
  }

  test("transaction('SERIALIZABLE') runs serializable and commits, as straight to Postgres", async ({ db, sql }) => {
    const options = fenceOptions(1, 'drivers/typeorm');
    expect(await serializableTransaction(db.url, options, 301)).toBe('serializable');
    expect(await serializableTransaction(sql.url('typeorm'), options, 300)).toBe('serializable');
    expect(await landed(db, 300)).toBe('typeorm');
  });
});

describe('Sequelize (node-postgres)', () => {
  /** transaction({ isolationLevel }): Sequelize sends START TRANSACTION, then SET TRANSACTION ISOLATION LEVEL. */
  async function serializableTransaction(url: string, options: string, id: number) {
    const sequelize = new Sequelize(url, { dialect: 'postgres', logging: false, dialectOptions: { options }, pool: { max: 1 } });
    try {
      return await answer(() =>
        sequelize.transaction({ isolationLevel: Transaction.ISOLATION_LEVELS.SERIALIZABLE }, async (transaction) => {
          const [shown] = await sequelize.query<{ transaction_isolation: string }>('SHOW transaction_isolation', {
            transaction,
            type: QueryTypes.SELECT,
          });
          await sequelize.query('INSERT INTO public.driver_rows VALUES (:id, :v)', { transaction, replacements: { id, v: 'sequelize' } });
          return shown?.transaction_isolation;
        }),
      );
    } finally {
      await sequelize.close();
    }
  }

  test('transaction({ isolationLevel: SERIALIZABLE }) runs serializable and commits, as straight to Postgres', async ({ db, sql }) => {
    const options = fenceOptions(1, 'drivers/sequelize');
    expect(await serializableTransaction(db.url, options, 401)).toBe('serializable');
    expect(await serializableTransaction(sql.url('sequelize'), options, 400)).toBe('serializable');
    expect(await landed(db, 400)).toBe('sequelize');
  });
});

describe('pgx (Go)', () => {
  // Built from test/fixtures/pgx-writer with Debian's Go and pgx source (scripts/setup.sh --test),
  // offline, in GOPATH mode; the build cache outlives the run.
  const source = join(import.meta.dirname, '..', '..', 'fixtures', 'pgx-writer');
  const binary = join(tmpdir(), `fencepost-pgx-writer-${process.pid}`);
  const built = (async () => {
    const cache = join(tmpdir(), 'fencepost-go-build');
    mkdirSync(cache, { recursive: true });
    await run('/usr/bin/go', ['build', '-o', binary, '.'], {
      cwd: source,
      env: { ...process.env, GOPATH: '/usr/share/gocode', GO111MODULE: 'off', GOFLAGS: '', GOCACHE: cache },
    });
  })();
  built.catch(() => {}); // awaited by each test
  afterAll(() => rmSync(binary, { force: true }));

  /** The program's steps: one JSON object per line. */
  async function pgx(url: string, token: string, fenceKey: string, base: number): Promise<unknown[]> {
    await built;
    const { stdout } = await run(binary, [url, token, fenceKey, String(base)]);
    return stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as unknown);
  }

  test('connect with the fence as RuntimeParams, queries, a prepared query, a batch and a serializable transaction: as straight to Postgres', async ({
    db,
    sql,
  }) => {
    const direct = await pgx(db.url, '1', 'drivers/pgx', 510);
    expect(direct).toContainEqual({ step: 'commit', value: 'ok' }); // the program itself runs clean
    expect(direct.filter((s) => (s as { code?: string }).code !== undefined)).toEqual([]);
    expect(await pgx(sql.url('pgx'), '1', 'drivers/pgx', 500)).toEqual(direct);
    expect([await landed(db, 500), await landed(db, 501), await landed(db, 502)]).toEqual(['pgx exec', 'pgx batch', 'pgx serializable']);
  }, 180_000);

  test('a tokenless session: the same steps answer as a read-only session straight to Postgres', async ({ db, sql }) => {
    const direct = await pgx(directUrl(db, DIRECT_TOKENLESS), '', '', 530);
    expect(direct).toContainEqual({ step: 'insert', code: '25006' });
    expect(await pgx(sql.url('pgx-reader'), '', '', 520)).toEqual(direct);
    expect(await landed(db, 520)).toBeNull();
  }, 180_000);

  test('a token below the fence: Connect itself fails with FP409', async ({ db, sql }) => {
    await raise(sql, 'drivers/pgx-stale', 5);
    expect(await pgx(sql.url('pgx-stale'), '4', 'drivers/pgx-stale', 540)).toEqual([{ step: 'connect', code: 'FP409' }]);
    expect(await landed(db, 540)).toBeNull();
  }, 180_000);
});
