// vitest fixtures for the setup most files share: a fresh database, an app over it, the SQL door.
// File-scoped: built on the first test that asks for them, torn down (in reverse order) after the
// file's last test. A test asks by destructuring its context: `test('…', async ({ db, app }) => …)`;
// suite hooks get them too: `test.beforeAll(async ({ db }) => …)`.
import { test } from 'vitest';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { clientRoleFor, createTestDatabase, type TestDatabase } from './db.ts';
import { adminQuery, uniqueRole } from './keys.ts';
import { testApp } from './proxy.ts';
import { startSqlProxy, type SqlProxy } from './sql.ts';
import { recordingStatements } from './statements.ts';

/**
 * A fresh, migrated database for the file (db.ts createTestDatabase), dropped after its last test.
 * (vitest reads a fixture's dependencies from its first parameter, which must be a destructuring:
 * hence the empty one.)
 */
// eslint-disable-next-line no-empty-pattern
export const dbTest = test.extend('db', { scope: 'file' }, async ({}, { onCleanup }): Promise<TestDatabase> => {
  const db = await createTestDatabase();
  onCleanup(() => db.drop());
  return db;
});

/** The file's database and an in-process app over it in open mode (proxy.ts testApp), driven with app.inject(). */
export const appTest = dbTest.extend('app', { scope: 'file' }, async ({ db }, { onCleanup }): Promise<FastifyInstance> => {
  const app = testApp(db.pool);
  onCleanup(() => app.close());
  await app.ready();
  return app;
});

/**
 * Two proxies (apps) on the file's database that share nothing but Postgres: `a` on the file's
 * pool, recording the name of each statement it runs (`statementsOfA`, statements.ts), `b` on a
 * pool and a store of its own.
 */
export const twoProxiesTest = dbTest.extend('proxies', { scope: 'file' }, async ({ db }, { onCleanup }) => {
  const recorded = recordingStatements(db.pool);
  const otherPool = new pg.Pool({ connectionString: db.url, max: 4 });
  otherPool.on('error', () => {});
  const a = testApp(recorded.pool);
  const b = testApp(otherPool);
  onCleanup(async () => {
    await Promise.all([a.close(), b.close()]);
    await otherPool.end();
  });
  await Promise.all([a.ready(), b.ready()]);
  return { a, b, statementsOfA: recorded.names };
});

/**
 * A NOLOGIN role unique to the run, for keys' `pgRole` (roles are cluster-wide). Dropped before the
 * database: its privileges there are dropped first, so DROP ROLE finds nothing left.
 */
export const roleTest = dbTest.extend('pgRole', { scope: 'file' }, async ({ db }, { onCleanup }): Promise<string> => {
  const role = uniqueRole('fx');
  await adminQuery(`CREATE ROLE ${role} NOLOGIN`);
  onCleanup(async () => {
    await db.pool.query(`DROP OWNED BY ${role}`);
    await adminQuery(`DROP ROLE IF EXISTS ${role}`);
  });
  return role;
});

/** A table SQL-door sessions (open mode) may use: created and granted to the client login. */
export interface ClientTable {
  /** `CREATE TABLE`'s argument: `public.items (id int PRIMARY KEY, v text)`. */
  definition: string;
  privileges: string;
}

/**
 * The file's database and a running proxy with its SQL endpoint on a free port (sql.ts
 * startSqlProxy). Two options a file sets by extending: `sqlEnv`, what the proxy's environment
 * adds (keys, TLS …), and `clientTables`, created once the proxy is up (it creates the client
 * login, FENCEPOST_CLIENT_ROLE, they are granted to):
 * `sqlTest.extend('clientTables', { scope: 'file' }, [{ definition: 'public.items (…)', privileges: 'SELECT' }])`,
 * `sqlTest.extend('sqlEnv', { scope: 'file' }, async ({ pgRole }) => ({ FENCEPOST_KEYS: … }))`
 * (pgRole is made only for a file that asks for it).
 */
export const sqlTest = roleTest
  .extend('sqlEnv', { scope: 'file' }, {} as Record<string, string>)
  .extend('clientTables', { scope: 'file' }, [] as ClientTable[])
  .extend('sql', { scope: 'file' }, async ({ db, sqlEnv, clientTables }, { onCleanup }): Promise<SqlProxy> => {
    const sql = await startSqlProxy(db, sqlEnv);
    onCleanup(() => sql.close());
    for (const t of clientTables) {
      await db.pool.query(`CREATE TABLE ${t.definition}`);
      await db.pool.query(
        `GRANT ${t.privileges} ON ${t.definition.slice(0, t.definition.indexOf('(')).trim()} TO ${clientRoleFor(db.url)}`,
      );
    }
    return sql;
  });
