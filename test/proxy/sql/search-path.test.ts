// Invariant: what the proxy runs on a writer's backend never resolves a name through the writer's
// search_path. The writer may own a schema, put it first and define its own operators there; the
// proxy's statements (the session fence, the proof, the read-only fence, the refusal while writes
// are refused) must still run only pg_catalog's and fencepost's. Before, the refusal's DO block
// (FENCEPOST_REQUIRE_SYNC_STANDBY=1 and no standby) compared with an unqualified `<>`, right after
// making the transaction read-write: a tokenless session's operator committed a row there.
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, type SqlProxy } from '../../support/sql.ts';

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

test('a leader and a tokenless session with the shadowing schema first: the proxy calls none of it', async () => {
  {
    const before = await calls();
    const leader = await sql.connect('shadow-leader', { options: `${fenceOptions(1, 'shadow')} ${SHADOWED}` });
    expect(await code(leader.query('SELECT 1'))).toBe('ok');
    expect(await code(leader.query('BEGIN'))).toBe('ok');
    expect(await code(leader.query('SELECT 2'))).toBe('ok');
    expect(await code(leader.query('COMMIT'))).toBe('ok');
    expect(await code(leader.query('SET fencepost.token = 2'))).toBe('ok');
    expect(await code(leader.query('SELECT 3'))).toBe('ok');
    await leader.end();
    const reader = await sql.connect('shadow-reader', { options: SHADOWED });
    expect(await code(reader.query('SELECT 1'))).toBe('ok');
    await reader.end();
    expect(await calls()).toBe(before);
    expect(await rows()).toEqual([]);
  }
});

test('while writes are refused (no synchronous standby): the refusal calls none of it, for a session with a token or without', async () => {
  const refusing = await startSqlProxy(db, { FENCEPOST_REQUIRE_SYNC_STANDBY: '1' });
  try {
    const before = await calls();
    const reader = await refusing.connect('refused-reader', { options: SHADOWED });
    expect(await code(reader.query('SELECT 1'))).toBe('ok');
    await reader.end();
    const writer = await refusing.connect('refused-writer', { options: `${fenceOptions(5, 'shadow-refused')} ${SHADOWED}` });
    expect(await code(writer.query("INSERT INTO public.items VALUES (1, 'refused')"))).toBe('FP533');
    await writer.end();
    expect(await calls()).toBe(before);
    expect(await rows()).toEqual([]);
  } finally {
    await refusing.close();
  }
});
