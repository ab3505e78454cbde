// Invariant: what fencepost runs on a writer's backend never resolves a name through the writer's
// search_path. The writer may own a schema, put it first (in its startup options, so it holds
// before the connection is fenced) and define its own operators there; the connection's fence
// (the backend start's read and fence_session at startup, the raise) and the protected table's trigger
// (refuse_unfenced_write, which has no SET search_path of its own) must still run only
// pg_catalog's and fencepost's. Before, a refusal's DO block compared with an unqualified `<>`
// right after making the transaction read-write: a tokenless session's operator committed a row there.
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, type SqlProxy } from '../../support/sql.ts';
import { protectTable } from '../../../src/fence/protect.ts';

let db: TestDatabase;
let role: string;
let sql: SqlProxy;
beforeAll(async () => {
  db = await createTestDatabase();
  sql = await startSqlProxy(db); // makes the client login
  role = clientRoleFor(db.url);
  await db.pool.query('CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  await db.pool.query(`GRANT SELECT, INSERT ON public.items TO ${role}`);
  await db.pool.query('CREATE SEQUENCE public.calls');
  await db.pool.query(`GRANT USAGE, UPDATE ON SEQUENCE public.calls TO ${role}`);
  // Protected tables, one per fence key.
  for (const [table, fenceKey] of [
    ['public.guarded', 'shadow'],
    ['public.guarded_write', 'shadow-write'],
  ] as const) {
    await db.pool.query(`CREATE TABLE ${table} (id int PRIMARY KEY, v text)`);
    await db.pool.query(`GRANT SELECT, INSERT ON ${table} TO ${role}`);
    await protectTable(db.pool, table, fenceKey);
  }
  // The writer's own schema, with operators and functions that shadow pg_catalog's for text: each
  // call writes a row (if it can) and counts itself in a sequence (nextval ignores read-only).
  await db.pool.query(`CREATE SCHEMA app AUTHORIZATION ${role}`);
  await db.pool.query(`CREATE FUNCTION app.shadow(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM pg_catalog.nextval('public.calls');
      BEGIN
        INSERT INTO public.items VALUES (pg_catalog.nextval('public.calls')::int, 'shadow');
      EXCEPTION WHEN read_only_sql_transaction THEN NULL;
      END;
      RETURN a OPERATOR(pg_catalog.<>) b;
    END $$`);
  for (const op of ['<>', '=']) await db.pool.query(`CREATE OPERATOR app.${op} (LEFTARG = text, RIGHTARG = text, FUNCTION = app.shadow)`);
  await db.pool.query(`ALTER FUNCTION app.shadow(text, text) OWNER TO ${role}`);
});
afterAll(async () => {
  await sql?.close();
  await db?.drop();
});

const calls = async () => Number((await db.pool.query<{ n: string }>('SELECT last_value AS n FROM public.calls')).rows[0]!.n);
const rows = async () => (await db.pool.query('SELECT id, v FROM public.items')).rows;
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );
const SHADOWED = '-c search_path=app,pg_catalog';

test('a leader, its successor and a tokenless session with the shadowing schema first: the connection fence calls none of it', async () => {
  const before = await calls();
  // Fenced at startup, the fence raised to 1 first.
  const leader = await sql.connect('shadow-leader', { options: `${fenceOptions(1, 'shadow')} ${SHADOWED}` });
  expect(await code(leader.query('SELECT 1'))).toBe('ok');
  expect(await code(leader.query('BEGIN'))).toBe('ok');
  expect(await code(leader.query('SELECT 2'))).toBe('ok');
  expect(await code(leader.query('COMMIT'))).toBe('ok');
  // Its successor's startup raises the fence to 2, which ends the leader's connection.
  const next = await sql.connect('shadow-next', { options: `${fenceOptions(2, 'shadow')} ${SHADOWED}` });
  expect(await code(next.query('SELECT 1'))).toBe('ok');
  expect(await code(leader.query('SELECT 3'))).toBe('FP409');
  await Promise.all([next.end(), leader.end().catch(() => {})]);
  // Tokenless, read-write lifted: the trigger refuses it (FP403).
  const reader = await sql.connect('shadow-reader', { options: SHADOWED });
  expect(await code(reader.query('SELECT 1'))).toBe('ok');
  expect(await code(reader.query('SET default_transaction_read_only = off'))).toBe('ok');
  expect(await code(reader.query("INSERT INTO public.guarded VALUES (4, 'tokenless')"))).toBe('FP403');
  await reader.end();
  expect(await calls()).toBe(before);
  expect(await rows()).toEqual([]);
  expect((await db.pool.query('SELECT id FROM public.guarded')).rows).toEqual([]);
});

test("a fenced writer's write to a protected table with the shadowing schema first: the trigger calls none of it, and the row lands", async () => {
  // The trigger (refuse_unfenced_write) is SECURITY DEFINER with no SET search_path: an operator it
  // resolved through the writer's search_path would run as the function's owner.
  const before = await calls();
  const leader = await sql.connect('shadow-writer', { options: `${fenceOptions(1, 'shadow-write')} ${SHADOWED}` });
  expect(await code(leader.query("INSERT INTO public.guarded_write VALUES (1, 'leader 1')"))).toBe('ok');
  await leader.end();
  expect(await calls()).toBe(before);
  expect(await rows()).toEqual([]);
  expect((await db.pool.query('SELECT id, v FROM public.guarded_write')).rows).toEqual([{ id: 1, v: 'leader 1' }]);
});

test('while writes are refused (no synchronous standby): a session with a token is refused at startup with FP533, one without reads; none of it is called', async () => {
  const refusing = await startSqlProxy(db, { FENCEPOST_REQUIRE_SYNC_STANDBY: '1' });
  try {
    const before = await calls();
    const reader = await refusing.connect('refused-reader', { options: SHADOWED });
    expect(await code(reader.query('SELECT 1'))).toBe('ok');
    await reader.end();
    expect(await code(refusing.connect('refused-writer', { options: `${fenceOptions(5, 'shadow-refused')} ${SHADOWED}` }))).toBe('FP533');
    expect(await calls()).toBe(before);
    expect(await rows()).toEqual([]);
  } finally {
    await refusing.close();
  }
});
