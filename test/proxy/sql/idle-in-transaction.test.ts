// The SQL endpoint bounds a transaction a writer leaves idle (FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS,
// 300 ms here), on the proxy's side: a writer's own idle_in_transaction_session_timeout = 0 does
// not lift it. Invariant: an ended transaction applied nothing (read in Postgres), and a
// transaction busy with a statement is never idle.
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

test.for([
  ['as it is', null],
  ['after lifting its own idle_in_transaction_session_timeout', 'SET idle_in_transaction_session_timeout = 0'],
])('a transaction left idle %s is ended: its COMMIT fails with 25P03, nothing applied', async ([, lift], { db, sql }) => {
  const name = `idle-${lift === null ? 'plain' : 'lifted'}`;
  const c = new pg.Client({ connectionString: sql.url('idler', { options: fenceOptions(1, 'idle/a') }), application_name: name });
  c.on('error', () => {});
  await c.connect();
  if (lift !== null && lift !== undefined) await c.query(lift);
  const id = lift === null ? 1 : 2;
  await c.query('BEGIN');
  await c.query(`INSERT INTO public.idle_items VALUES (${id})`);
  await backendGone(db, name);
  const err = await c.query('COMMIT').catch((e: pg.DatabaseError) => e);
  expect((err as pg.DatabaseError).code).toBe('25P03');
  expect(await has(db, id)).toBe(false);
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
