// A connection's transaction modes are the writer's, as straight to Postgres: the connection is
// fenced once, at startup, and its backend starts read-write (with a token) or read-only (without
// one); after that nothing of the proxy's touches its modes, so a writer that asks for read-only
// gets read-only, and one that lifts it gets read-write. Each test names the client and the way
// it asks; the invariant of each: a write in a transaction the writer made read-only fails 25006
// and nothing of it lands, and the same connection writes again once the writer lifts it. What
// keeps a tokenless writer out of protected data is Postgres (FP403), not the read-only default.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect } from 'vitest';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions } from '../../support/sql.ts';
import { protectTable } from '../../../src/fence/protect.ts';

const run = promisify(execFile);
const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.modes (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
  { definition: 'public.modes_guarded (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
]);
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );
let next = 0;
const id = () => ++next;

describe('read-only, as the writer asks for it (node-postgres)', () => {
  test('BEGIN READ ONLY: the INSERT fails 25006, nothing lands; the next transaction writes', async ({ db, sql }) => {
    const c = await sql.connect('modes-begin', { options: fenceOptions(1, 'modes/begin') });
    const [a, b] = [id(), id()];
    await c.query('BEGIN READ ONLY');
    expect(await code(c.query('INSERT INTO public.modes VALUES ($1, $2)', [a, 'read only']))).toBe('25006');
    await c.query('ROLLBACK');
    await c.query('INSERT INTO public.modes VALUES ($1, $2)', [b, 'read write']);
    expect((await db.pool.query('SELECT id FROM public.modes WHERE id = ANY($1) ORDER BY id', [[a, b]])).rows).toEqual([{ id: b }]);
    await c.end();
  });

  test('SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY (pgJDBC setReadOnly), then READ WRITE', async ({ db, sql }) => {
    const c = await sql.connect('modes-characteristics', { options: fenceOptions(1, 'modes/characteristics') });
    const [a, b] = [id(), id()];
    await c.query('SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY');
    expect(await code(c.query('INSERT INTO public.modes VALUES ($1, $2)', [a, 'read only']))).toBe('25006');
    await c.query('SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE');
    await c.query('INSERT INTO public.modes VALUES ($1, $2)', [b, 'read write']);
    expect((await db.pool.query('SELECT id FROM public.modes WHERE id = ANY($1) ORDER BY id', [[a, b]])).rows).toEqual([{ id: b }]);
    await c.end();
  });

  test('SET default_transaction_read_only = on, in the extended protocol too; RESET ALL lifts it and the session stays fenced', async ({
    db,
    sql,
  }) => {
    const c = await sql.connect('modes-default', { options: fenceOptions(1, 'modes/default') });
    const [a, b, x] = [id(), id(), id()];
    await c.query('SET default_transaction_read_only = on');
    expect(await code(c.query({ text: 'INSERT INTO public.modes VALUES ($1, $2)', values: [a, 'read only'], name: 'ins' }))).toBe('25006');
    await c.query('RESET ALL');
    await c.query({ text: 'INSERT INTO public.modes VALUES ($1, $2)', values: [b, 'read write'], name: 'ins' });
    expect((await db.pool.query('SELECT id FROM public.modes WHERE id = ANY($1) ORDER BY id', [[a, b]])).rows).toEqual([{ id: b }]);
    // Still fenced after the RESET: a raise above its token ends the connection (FP409), whether
    // it hears so at once (an 'error' event) or at its next write.
    const ended = new Promise<unknown>((resolve) => c.once('error', resolve));
    expect((await fetch(`${sql.proxy.url}/v1/fences/modes%2Fdefault`, { method: 'PUT', headers: { 'fencing-token': '2' } })).status).toBe(
      200,
    );
    const answer = await Promise.race([
      ended,
      c.query('INSERT INTO public.modes VALUES ($1, $2)', [x, 'stale']).then(
        () => 'written',
        (e: unknown) => e,
      ),
    ]);
    expect(answer).toMatchObject({ code: 'FP409' });
    expect((await db.pool.query('SELECT id FROM public.modes WHERE id = $1', [x])).rows).toEqual([]);
    await c.end().catch(() => {});
  });

  test('a connection without a token starts read-only (25006, as Postgres words it); lifted, it writes unprotected tables, and protected ones refuse it (FP403)', async ({
    db,
    sql,
  }) => {
    await protectTable(db.pool, 'public.modes_guarded', 'modes/guarded');
    const c = await sql.connect('modes-tokenless');
    const [a, b, x, y] = [id(), id(), id(), id()];
    const readOnly = await c.query('INSERT INTO public.modes VALUES ($1, $2)', [a, 'tokenless']).then(
      () => null,
      (e: { code?: string; hint?: string }) => e,
    );
    expect(readOnly).toMatchObject({ code: '25006', message: 'cannot execute INSERT in a read-only transaction' });
    expect(readOnly?.hint).toBeUndefined(); // no hint of the proxy's
    await c.query('SET default_transaction_read_only = off');
    await c.query('INSERT INTO public.modes VALUES ($1, $2)', [b, 'tokenless, lifted']);
    expect(await code(c.query('INSERT INTO public.modes_guarded VALUES ($1, $2)', [x, 'tokenless']))).toBe('FP403');
    await c.query('BEGIN READ WRITE');
    expect(await code(c.query('INSERT INTO public.modes_guarded VALUES ($1, $2)', [y, 'tokenless']))).toBe('FP403');
    await c.query('ROLLBACK');
    await c.end();
    expect((await db.pool.query('SELECT id FROM public.modes WHERE id = ANY($1) ORDER BY id', [[a, b]])).rows).toEqual([{ id: b }]);
    expect((await db.pool.query('SELECT id FROM public.modes_guarded')).rows).toEqual([]);
  });
});

describe('read-only in Python drivers', () => {
  test('psycopg2 set_session(readonly=True) and psycopg 3 read_only = True get 25006; off again, they write', async ({ db, sql }) => {
    const [a, b, c, d] = [id(), id(), id(), id()];
    const program = `import sys, psycopg2, psycopg
url, a, b, c, d = sys.argv[1], *map(int, sys.argv[2:6])
out = []
conn = psycopg2.connect(url, options=sys.argv[6])
conn.set_session(readonly=True)
try:
    conn.cursor().execute('INSERT INTO public.modes VALUES (%s, %s)', (a, 'psycopg2 ro'))
    out.append('committed')
except psycopg2.Error as e:
    out.append(e.pgcode)
conn.rollback()
conn.set_session(readonly=False)
conn.cursor().execute('INSERT INTO public.modes VALUES (%s, %s)', (b, 'psycopg2 rw'))
conn.commit()
conn3 = psycopg.connect(url, options=sys.argv[6])
conn3.read_only = True
try:
    conn3.execute('INSERT INTO public.modes VALUES (%s, %s)', (c, 'psycopg ro'))
    out.append('committed')
except psycopg.Error as e:
    out.append(e.sqlstate)
conn3.rollback()
conn3.read_only = False
conn3.execute('INSERT INTO public.modes VALUES (%s, %s)', (d, 'psycopg rw'))
conn3.commit()
print(' '.join(out))`;
    const { stdout } = await run('/usr/bin/python3', [
      '-c',
      program,
      sql.url('modes-python'),
      ...[a, b, c, d].map(String),
      fenceOptions(1, 'modes/python'),
    ]);
    expect(stdout.trim()).toBe('25006 25006');
    expect((await db.pool.query('SELECT id FROM public.modes WHERE id = ANY($1) ORDER BY id', [[a, b, c, d]])).rows).toEqual([
      { id: b },
      { id: d },
    ]);
  });
});
