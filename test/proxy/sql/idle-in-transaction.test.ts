// The SQL endpoint bounds a transaction a writer leaves idle through Postgres:
// FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS (300 ms here) is the backend's
// idle_in_transaction_session_timeout at startup, so Postgres ends such a session with FATAL 25P03,
// which the endpoint passes to the writer. A writer that SETs its own timeout off lifts it, as it
// would straight to Postgres. Invariant: an ended transaction applied nothing (read in Postgres),
// and a transaction busy with a statement is never idle.
import { expect } from 'vitest';
import pg from 'pg';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions } from '../../support/sql.ts';
import type { TestDatabase } from '../../support/db.ts';

const test = sqlTest
  .extend('sqlEnv', { scope: 'file' }, { FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS: '300' })
  .extend('clientTables', { scope: 'file' }, [{ definition: 'public.idle_items (id int PRIMARY KEY)', privileges: 'SELECT, INSERT' }]);

const has = async (db: TestDatabase, id: number) =>
  (await db.pool.query('SELECT 1 FROM public.idle_items WHERE id = $1', [id])).rowCount === 1;
/** The backend of application `name` is gone. */
const backendGone = (db: TestDatabase, name: string) =>
  expect
    .poll(async () => (await db.pool.query('SELECT 1 FROM pg_stat_activity WHERE application_name = $1', [name])).rowCount, {
      interval: 25,
    })
    .toBe(0);

test('a transaction left idle is ended by Postgres: the writer hears its FATAL 25P03, nothing applied', async ({ db, sql }) => {
  const name = 'idle-plain';
  const c = new pg.Client({ connectionString: sql.url('idler', { options: fenceOptions(1, 'idle/a') }), application_name: name });
  const errors: pg.DatabaseError[] = [];
  c.on('error', (e) => errors.push(e as pg.DatabaseError));
  await c.connect();
  expect((await c.query('SHOW idle_in_transaction_session_timeout')).rows[0]).toEqual({ idle_in_transaction_session_timeout: '300ms' });
  await c.query('BEGIN');
  await c.query('INSERT INTO public.idle_items VALUES (1)');
  await backendGone(db, name);
  // The FATAL comes while the client is idle: node-postgres emits it as an 'error'.
  await expect.poll(() => errors.length).toBeGreaterThan(0);
  expect(errors[0]).toMatchObject({ code: '25P03', severity: 'FATAL' });
  expect(await c.query('COMMIT').catch((e: unknown) => e)).toBeInstanceOf(Error);
  expect(await has(db, 1)).toBe(false);
});

test('a writer that sets its own idle_in_transaction_session_timeout to 0 lifts it, as straight to Postgres: its idle transaction commits', async ({
  db,
  sql,
}) => {
  const c = await sql.connect('lifter', { options: fenceOptions(1, 'idle/c') });
  await c.query('SET idle_in_transaction_session_timeout = 0');
  await c.query('BEGIN');
  await c.query('INSERT INTO public.idle_items VALUES (2)');
  await new Promise((r) => setTimeout(r, 1000)); // idle for more than three times the proxy's 300 ms
  expect((await c.query('COMMIT')).command).toBe('COMMIT');
  expect(await has(db, 2)).toBe(true);
  await c.end();
});

test('a transaction running a statement longer than the limit is not idle: it commits', async ({ db, sql }) => {
  const c = await sql.connect('busy', { options: fenceOptions(1, 'idle/b') });
  await c.query('BEGIN');
  await c.query('INSERT INTO public.idle_items VALUES (3)');
  await c.query('SELECT pg_sleep(1)');
  await c.query('COMMIT');
  expect(await has(db, 3)).toBe(true);
  await c.end();
});
