// docs/orms.md's examples, one per library, through the SQL endpoint: the table is made straight to
// Postgres as its owner (the library's own migration or schema tool where it has one, else SQL) and
// granted to the client login; a leader's pool writes with its token; a newer leader's raise ends
// it, and its next write fails with FP409, which fenceRefusal reads wherever the library put it; a
// new pool with the new token writes. Invariant: the old pool's write after the raise never lands.
import { setTimeout as delay } from 'node:timers/promises';
import pg from 'pg';
import postgres from 'postgres';
import knex, { type Knex } from 'knex';
import { Kysely, PostgresDialect } from 'kysely';
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres';
import { drizzle as drizzlePostgresJs } from 'drizzle-orm/postgres-js';
import { integer, pgTable, text } from 'drizzle-orm/pg-core';
import 'reflect-metadata';
import { DataSource, EntitySchema as TypeOrmEntity } from 'typeorm';
import { DataTypes, Sequelize } from 'sequelize';
import { EntitySchema as MikroEntity, MikroORM } from '@mikro-orm/postgresql';
import PgBoss from 'pg-boss';
import { describe, expect } from 'vitest';
import { fenceRefusal } from '../../src/writer/index.ts';
import { sqlTest } from '../support/fixtures.ts';
import { clientRoleFor, type TestDatabase } from '../support/db.ts';
import { fenceOptions, raiseFence, type SqlProxy } from '../support/sql.ts';

const test = sqlTest;

/** A library's pool, as docs/orms.md shows it: opened with a token, written through, closed. */
interface Library<P> {
  /** `options`: the startup options with the token and fence key (`-c fencepost.token=… -c fencepost.fence_key=…`). */
  open(url: string, options: string): P | Promise<P>;
  write(pool: P, id: number, v: string): Promise<unknown>;
  close(pool: P): Promise<unknown>;
}

/** The old term's write is answered within this (a lost answer fails the test, not its timeout). */
const ANSWER_MS = 20_000;

/** `work`, or a TIMEOUT error once `ms` have passed without it settling. */
const within = (work: Promise<unknown>, ms: number): Promise<unknown> =>
  Promise.race([
    work,
    delay(ms).then(() => {
      throw Object.assign(new Error(`no answer in ${ms} ms`), { code: 'TIMEOUT' });
    }),
  ]);

const grant = (db: TestDatabase, table: string) =>
  db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ${table} TO ${clientRoleFor(db.url)}`);

type Landed = (ids: number[]) => Promise<{ id: number; v: string }[]>;

/** The rows of `table` among `ids`, read straight from Postgres. */
const rowsOf =
  (db: TestDatabase, table: string): Landed =>
  async (ids) =>
    (await db.pool.query<{ id: number; v: string }>(`SELECT id, v FROM ${table} WHERE id = ANY($1) ORDER BY id`, [ids])).rows;

/** What `work` threw; null when it did not. */
const attempt = (work: () => Promise<unknown>): Promise<unknown> =>
  work().then(
    () => null,
    (err: unknown) => err,
  );

/**
 * Two terms of one fence key through the endpoint. Returns what the first term's pool threw once a
 * newer leader raised the fence (after checking fenceRefusal reads it), for the caller to say where
 * its SQLSTATE is.
 */
async function twoTerms<P>(
  ctx: { db: TestDatabase; sql: SqlProxy },
  lib: Library<P>,
  o: { table: string | Landed; fenceKey: string; base: number },
): Promise<unknown> {
  const { db, sql } = ctx;
  const url = sql.url('orders-writer');
  const [first, zombie, second] = [o.base, o.base + 1, o.base + 2];
  let refused: unknown = null;
  const old = await lib.open(url, fenceOptions(1, o.fenceKey));
  try {
    await lib.write(old, first, 'term 1');
    await raiseFence(sql, o.fenceKey, 2); // a newer leader
    const write = lib.write(old, zombie, 'zombie');
    refused = await attempt(() => within(write, ANSWER_MS));
  } finally {
    await lib.close(old);
  }
  const refusal = { code: 'FP409', fenceKey: o.fenceKey, token: 1n, highestToken: 2n };
  expect(fenceRefusal(refused)).toEqual(refusal);
  // The old leader's new pool, with its old token: refused at connect, the same refusal.
  const reopened = await attempt(async () => {
    const stale = await lib.open(url, fenceOptions(1, o.fenceKey));
    try {
      await lib.write(stale, zombie, 'zombie');
    } finally {
      await lib.close(stale);
    }
  });
  expect(fenceRefusal(reopened)).toEqual(refusal);
  const next = await lib.open(url, fenceOptions(2, o.fenceKey));
  try {
    await lib.write(next, second, 'term 2');
  } finally {
    await lib.close(next);
  }
  const landed = typeof o.table === 'string' ? rowsOf(db, o.table) : o.table;
  expect(await landed([first, zombie, second])).toEqual([
    { id: first, v: 'term 1' },
    { id: second, v: 'term 2' },
  ]);
  return refused;
}

type Wrapped = { code?: string; cause?: Wrapped; parent?: Wrapped; original?: Wrapped };
const codeOf = (err: unknown) => (err as Wrapped).code;

describe('node-postgres (pg)', () => {
  const pool: Library<pg.Pool> = {
    open: (connectionString, options) => {
      const p = new pg.Pool({ connectionString, options });
      p.on('error', () => {}); // an idle client the raise ended
      return p;
    },
    write: (p, id, v) => p.query('INSERT INTO public.pg_rows VALUES ($1, $2)', [id, v]),
    close: (p) => p.end(),
  };

  test('pg.Pool({ options }): FP409 in err.code, a new pool with the new token writes', async ({ db, sql }) => {
    await db.pool.query('CREATE TABLE public.pg_rows (id int PRIMARY KEY, v text)');
    await grant(db, 'public.pg_rows');
    const err = await twoTerms({ db, sql }, pool, { table: 'public.pg_rows', fenceKey: 'orms/pg', base: 1 });
    expect(codeOf(err)).toBe('FP409');
  });
});

describe('Knex', () => {
  test('knex({ connection: { options } }), migrated straight to Postgres: FP409 in err.code, a new knex with the new token writes', async ({
    db,
    sql,
  }) => {
    const owner = knex({ client: 'pg', connection: db.url });
    try {
      await owner.schema.createTable('knex_rows', (t) => {
        t.integer('id').primary();
        t.text('v');
      });
    } finally {
      await owner.destroy();
    }
    await grant(db, 'public.knex_rows');
    const lib: Library<Knex> = {
      open: (connectionString, options) => knex({ client: 'pg', connection: { connectionString, options } }),
      write: (k, id, v) => k('knex_rows').insert({ id, v }),
      close: (k) => k.destroy(),
    };
    const err = await twoTerms({ db, sql }, lib, { table: 'public.knex_rows', fenceKey: 'orms/knex', base: 1 });
    expect(codeOf(err)).toBe('FP409');
  });

  test('one knex with a connection function: its expirationChecker makes new connections take the new token', async ({ db, sql }) => {
    const fenceKey = 'orms/knex-function';
    let term = { token: 1n };
    const k = knex({
      client: 'pg',
      connection: () => {
        const mine = term;
        return {
          connectionString: sql.url('orders-writer'),
          options: fenceOptions(mine.token, fenceKey),
          expirationChecker: () => term !== mine,
        };
      },
    });
    try {
      await k('knex_rows').insert({ id: 11, v: 'term 1' });
      await raiseFence(sql, fenceKey, 2);
      const err = await attempt(() => k('knex_rows').insert({ id: 12, v: 'zombie' }));
      expect(fenceRefusal(err)).toEqual({ code: 'FP409', fenceKey, token: 1n, highestToken: 2n });
      term = { token: 2n }; // elected again
      await k('knex_rows').insert({ id: 13, v: 'term 2' });
    } finally {
      await k.destroy();
    }
    expect(await rowsOf(db, 'public.knex_rows')([11, 12, 13])).toEqual([
      { id: 11, v: 'term 1' },
      { id: 13, v: 'term 2' },
    ]);
  });
});

describe('Kysely', () => {
  interface Database {
    kysely_rows: { id: number; v: string };
  }
  const open = (connectionString: string, options?: string) =>
    new Kysely<Database>({ dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString, options }) }) });

  test('PostgresDialect({ pool: new pg.Pool({ options }) }): FP409 in err.code, a new Kysely with the new token writes', async ({
    db,
    sql,
  }) => {
    const owner = open(db.url);
    try {
      await owner.schema
        .createTable('kysely_rows')
        .addColumn('id', 'integer', (c) => c.primaryKey())
        .addColumn('v', 'text')
        .execute();
    } finally {
      await owner.destroy();
    }
    await grant(db, 'public.kysely_rows');
    const lib: Library<Kysely<Database>> = {
      open,
      write: (k, id, v) => k.insertInto('kysely_rows').values({ id, v }).execute(),
      close: (k) => k.destroy(),
    };
    const err = await twoTerms({ db, sql }, lib, { table: 'public.kysely_rows', fenceKey: 'orms/kysely', base: 1 });
    expect(codeOf(err)).toBe('FP409');
  });
});

describe('Drizzle', () => {
  const drizzleRows = pgTable('drizzle_rows', { id: integer('id').primaryKey(), v: text('v') });
  test.beforeAll(async ({ db }) => {
    // drizzle-kit (not installed here) would run this straight to Postgres, as the owner.
    await db.pool.query('CREATE TABLE public.drizzle_rows (id int PRIMARY KEY, v text)');
    await grant(db, 'public.drizzle_rows');
  });

  test('on node-postgres, pg.Pool({ options }): FP409 in err.cause.code', async ({ db, sql }) => {
    const lib: Library<{ pool: pg.Pool; db: ReturnType<typeof drizzlePg> }> = {
      open: (connectionString, options) => {
        const pool = new pg.Pool({ connectionString, options });
        pool.on('error', () => {});
        return { pool, db: drizzlePg({ client: pool }) };
      },
      write: (d, id, v) => d.db.insert(drizzleRows).values({ id, v }),
      close: (d) => d.pool.end(),
    };
    const err = await twoTerms({ db, sql }, lib, { table: 'public.drizzle_rows', fenceKey: 'orms/drizzle-pg', base: 1 });
    expect(codeOf(err)).toBeUndefined();
    expect((err as Wrapped).cause?.code).toBe('FP409');
  });

  test('on postgres.js, postgres({ connection: { options } }): FP409 in err.cause.code', async ({ db, sql }) => {
    const lib: Library<{ client: postgres.Sql; db: ReturnType<typeof drizzlePostgresJs> }> = {
      open: (url, options) => {
        const client = postgres(url, { onnotice: () => {}, connection: { options } });
        return { client, db: drizzlePostgresJs({ client }) };
      },
      write: (d, id, v) => d.db.insert(drizzleRows).values({ id, v }),
      close: (d) => d.client.end({ timeout: 5 }),
    };
    const err = await twoTerms({ db, sql }, lib, { table: 'public.drizzle_rows', fenceKey: 'orms/drizzle-postgres-js', base: 11 });
    expect((err as Wrapped).cause?.code).toBe('FP409');
  });
});

describe('postgres.js', () => {
  test('postgres({ connection: { options } }): FP409 in err.code, a new instance with the new token writes', async ({ db, sql }) => {
    await db.pool.query('CREATE TABLE public.postgres_js_rows (id int PRIMARY KEY, v text)');
    await grant(db, 'public.postgres_js_rows');
    const lib: Library<postgres.Sql> = {
      open: (url, options) => postgres(url, { onnotice: () => {}, connection: { options } }),
      write: (s, id, v) => s`INSERT INTO public.postgres_js_rows VALUES (${id}, ${v})`,
      close: (s) => s.end({ timeout: 5 }),
    };
    const err = await twoTerms({ db, sql }, lib, { table: 'public.postgres_js_rows', fenceKey: 'orms/postgres-js', base: 1 });
    expect(codeOf(err)).toBe('FP409');
  });
});

describe('TypeORM', () => {
  const TypeormRow = new TypeOrmEntity<{ id: number; v: string }>({
    name: 'TypeormRow',
    tableName: 'typeorm_rows',
    columns: { id: { type: Number, primary: true }, v: { type: String } },
  });

  test('DataSource({ extra: { options } }), synchronized straight to Postgres: FP409 in err.code', async ({ db, sql }) => {
    const owner = new DataSource({ type: 'postgres', url: db.url, entities: [TypeormRow], synchronize: true, logging: false });
    await owner.initialize();
    await owner.destroy();
    await grant(db, 'public.typeorm_rows');
    const lib: Library<DataSource> = {
      open: (url, options) =>
        new DataSource({ type: 'postgres', url, extra: { options }, entities: [TypeormRow], logging: false }).initialize(),
      write: (s, id, v) => s.getRepository(TypeormRow).insert({ id, v }),
      close: (s) => s.destroy(),
    };
    const err = await twoTerms({ db, sql }, lib, { table: 'public.typeorm_rows', fenceKey: 'orms/typeorm', base: 1 });
    expect(codeOf(err)).toBe('FP409');
  });
});

describe('Sequelize', () => {
  const define = (s: Sequelize) =>
    s.define(
      'SequelizeRow',
      { id: { type: DataTypes.INTEGER, primaryKey: true }, v: DataTypes.TEXT },
      { tableName: 'sequelize_rows', timestamps: false },
    );

  test('new Sequelize(url, { dialectOptions: { options } }), synced straight to Postgres: FP409 in err.parent.code', async ({
    db,
    sql,
  }) => {
    const owner = new Sequelize(db.url, { dialect: 'postgres', logging: false });
    try {
      await define(owner).sync();
    } finally {
      await owner.close();
    }
    await grant(db, 'public.sequelize_rows');
    const lib: Library<Sequelize> = {
      open: (url, options) => new Sequelize(url, { dialect: 'postgres', logging: false, dialectOptions: { options } }),
      write: (s, id, v) => define(s).create({ id, v }),
      close: (s) => s.close(),
    };
    const err = await twoTerms({ db, sql }, lib, { table: 'public.sequelize_rows', fenceKey: 'orms/sequelize', base: 1 });
    expect(codeOf(err)).toBeUndefined();
    expect((err as Wrapped).parent?.code).toBe('FP409');
  });
});

describe('MikroORM', () => {
  const MikroRow = new MikroEntity<{ id: number; v: string }>({
    name: 'MikroRow',
    tableName: 'mikro_rows',
    properties: { id: { type: 'number', primary: true, autoincrement: false }, v: { type: 'string' } },
  });
  const init = (clientUrl: string, options?: string) =>
    MikroORM.init({
      clientUrl,
      entities: [MikroRow],
      ...(options !== undefined ? { driverOptions: { connection: { options } } } : {}),
      debug: false,
    });

  test('MikroORM.init({ driverOptions: { connection: { options } } }), schema made straight to Postgres: FP409 in err.code', async ({
    db,
    sql,
  }) => {
    const owner = await init(db.url);
    try {
      await owner.schema.createSchema();
    } finally {
      await owner.close(true);
    }
    await grant(db, 'public.mikro_rows');
    const lib: Library<MikroORM> = {
      open: init,
      write: (orm, id, v) => orm.em.fork().insert(MikroRow, { id, v }),
      close: (orm) => orm.close(true),
    };
    const err = await twoTerms({ db, sql }, lib, { table: 'public.mikro_rows', fenceKey: 'orms/mikro-orm', base: 1 });
    expect(codeOf(err)).toBe('FP409');
  });
});

describe('pg-boss', () => {
  const schema = 'pgboss_orms';
  const queue = 'orders-jobs';

  // Writers need USAGE on the schema and SELECT, INSERT, UPDATE, DELETE on its tables; its two
  // functions (create_queue, delete_queue) make and drop tables: the owner's.
  test('migrate: false with the token in the URL, its schema made and granted straight to Postgres: FP409 in err.code, a worker fetches and completes', async ({
    db,
    sql,
  }) => {
    const owner = new PgBoss({ connectionString: db.url, schema, supervise: false, schedule: false });
    owner.on('error', () => {});
    await owner.start(); // migrates: creates the schema
    await owner.createQueue(queue); // DDL (a partition of its own): as the owner too
    await owner.stop({ graceful: false, wait: true });
    const role = clientRoleFor(db.url);
    await db.pool.query(`GRANT USAGE ON SCHEMA ${schema} TO ${role}`);
    await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ${schema} TO ${role}`);

    const lib: Library<PgBoss> = {
      open: async (url, options) => {
        const u = new URL(url);
        u.searchParams.set('options', options); // pg-boss's types have no `options`: the URL carries it
        const boss = new PgBoss({ connectionString: u.toString(), schema, migrate: false, supervise: false, schedule: false });
        boss.on('error', () => {});
        return boss.start();
      },
      write: (boss, id, v) => boss.send(queue, { id, v }),
      close: (boss) => boss.stop({ graceful: false, wait: true }),
    };
    const jobs: Landed = async (ids) =>
      (
        await db.pool.query<{ id: number; v: string }>(
          `SELECT (data->>'id')::int AS id, data->>'v' AS v FROM ${schema}.job WHERE name = $1 AND (data->>'id')::int = ANY($2) ORDER BY 1`,
          [queue, ids],
        )
      ).rows;
    const err = await twoTerms({ db, sql }, lib, { table: jobs, fenceKey: 'orms/pg-boss', base: 1 });
    expect(codeOf(err)).toBe('FP409');
    // A queue the owner creates after the grants is a new partition of job: no new grant.
    const later = new PgBoss({ connectionString: db.url, schema, supervise: false, schedule: false });
    later.on('error', () => {});
    await later.start();
    await later.createQueue('orders-later');
    await later.stop({ graceful: false, wait: true });
    // A worker of the new term fetches the jobs and completes them, through the endpoint too.
    const worker = await lib.open(sql.url('orders-worker'), fenceOptions(2, 'orms/pg-boss'));
    try {
      expect(await worker.send('orders-later', { id: 9 })).toMatch(/^[0-9a-f-]{36}$/);
      const fetched = await worker.fetch<{ id: number; v: string }>(queue, { batchSize: 10 });
      expect(fetched.map((j) => j.data.id).sort()).toEqual([1, 3]);
      await worker.complete(
        queue,
        fetched.map((j) => j.id),
      );
    } finally {
      await lib.close(worker);
    }
    const done = await db.pool.query(`SELECT data->>'v' AS v FROM ${schema}.job WHERE name = $1 AND state = 'completed' ORDER BY 1`, [
      queue,
    ]);
    expect(done.rows).toEqual([{ v: 'term 1' }, { v: 'term 2' }]);
  });
});
