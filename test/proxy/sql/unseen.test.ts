// Nothing of the endpoint's shows to the writer: the connection is fenced once, at startup, before
// the writer's first message; after that the proxy relays the writer's messages and the
// database's answers as they are. Invariant of each test: what the writer sees of its session
// (prepared statements, current_query(), pg_stat_activity.query, its own unnamed statement,
// ParameterStatus) is what it would see straight to Postgres, and the connection stays fenced (a
// write commits).
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect } from 'vitest';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions } from '../../support/sql.ts';
import { B, D, E, P, Q, RawClient, S } from './raw-client.ts';

const run = promisify(execFile);
const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.seen (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
]);
let next = 0;
const id = () => ++next;
const PREPARED = 'SELECT name FROM pg_catalog.pg_prepared_statements ORDER BY name';

describe('pg_prepared_statements and current_query() (node-postgres)', () => {
  test('a session that ran named, unnamed and simple statements sees only its own prepared statement', async ({ db, sql }) => {
    const c = await sql.connect('unseen-pg', { options: fenceOptions(1, 'unseen/pg') });
    const [a, b, d] = [id(), id(), id()];
    await c.query({ name: 'ins', text: 'INSERT INTO public.seen VALUES ($1, $2)', values: [a, 'named'] });
    await c.query('INSERT INTO public.seen VALUES ($1, $2)', [b, 'unnamed']);
    await c.query(`INSERT INTO public.seen VALUES (${d}, 'simple')`);
    const extended = await c.query({ text: PREPARED, values: [] });
    const named = await c.query({ name: 'list', text: PREPARED });
    const simple = await c.query(PREPARED);
    expect(extended.rows.map((r) => r.name)).toEqual(['ins']);
    expect(named.rows.map((r) => r.name)).toEqual(['ins', 'list']);
    expect(simple.rows.map((r) => r.name)).toEqual(['ins', 'list']);
    expect((await db.pool.query('SELECT count(*)::int AS n FROM public.seen WHERE id = ANY($1)', [[a, b, d]])).rows[0].n).toBe(3);
    await c.end();
  });

  test("current_query() of an extended-protocol statement is the writer's text", async ({ sql }) => {
    const c = await sql.connect('unseen-current', { options: fenceOptions(1, 'unseen/current') });
    const text = 'SELECT pg_catalog.current_query() AS q, $1::int AS one';
    expect((await c.query(text, [1])).rows[0].q).toBe(text);
    expect((await c.query({ name: 'cq', text, values: [1] })).rows[0].q).toBe(text);
    await c.end();
  });
});

describe('a simple-protocol Query in a block (node-postgres, no parameters)', () => {
  test("current_query() and pg_stat_activity.query are the writer's text, in a block from its first Query on", async ({ db, sql }) => {
    const c = await sql.connect('unseen-block', { options: fenceOptions(1, 'unseen/block') });
    const n = id();
    await c.query('BEGIN');
    const text = 'SELECT pg_catalog.current_query() AS q, pg_catalog.pg_backend_pid() AS pid';
    const first = (await c.query(text)).rows[0];
    expect(first.q).toBe(text);
    const insert = `INSERT INTO public.seen VALUES (${n}, 'block')`;
    await c.query(insert);
    // Idle in the block: its last Query is the writer's.
    expect((await db.pool.query('SELECT query FROM pg_catalog.pg_stat_activity WHERE pid = $1', [first.pid])).rows[0].query).toBe(insert);
    await c.query('COMMIT');
    expect((await db.pool.query('SELECT v FROM public.seen WHERE id = $1', [n])).rows).toEqual([{ v: 'block' }]);
    await c.end();
  });

  test("a block open when a newer leader's connection raises the fence: its next Query hears FP409, nothing of the block lands", async ({
    db,
    sql,
  }) => {
    const old = await sql.connect('unseen-stale-old', { options: fenceOptions(1, 'unseen/stale') });
    // The raise ends the old connection: whether it hears so at once (an 'error' event) or at its
    // next Query, what it hears is FP409.
    const ended = new Promise<unknown>((resolve) => old.once('error', resolve));
    const n = id();
    await old.query('BEGIN');
    await old.query(`INSERT INTO public.seen VALUES (${n}, 'stale')`);
    const leader = await sql.connect('unseen-stale-new', { options: fenceOptions(2, 'unseen/stale') });
    const m = id();
    await leader.query(`INSERT INTO public.seen VALUES (${m}, 'leader')`);
    const answer = await Promise.race([
      ended,
      old.query('COMMIT').then(
        () => 'committed',
        (e: unknown) => e,
      ),
    ]);
    expect(answer).toMatchObject({ code: 'FP409' });
    expect((await db.pool.query('SELECT id FROM public.seen WHERE id = ANY($1) ORDER BY id', [[n, m]])).rows).toEqual([{ id: m }]);
    await old.end().catch(() => {});
    await leader.end();
  });
});

describe("the writer's unnamed statement (raw protocol)", () => {
  test("parsed in one group and bound in the next, it runs the writer's statement; no prepared statement of the proxy's exists", async ({
    db,
    sql,
  }) => {
    const raw = await RawClient.connect(sql.port, sql.database, 'unseen-raw', fenceOptions(1, 'unseen/raw'));
    const n = id();
    const parsed = await raw.send([P(`INSERT INTO public.seen VALUES (${n}, 'mine') RETURNING v`), D(), S()]);
    expect(parsed.errors).toEqual([]);
    // The next group binds it, in a transaction of its own, as straight to Postgres.
    const bound = await raw.send([B(), E(), S()]);
    expect(bound.errors).toEqual([]);
    expect(bound.rows).toEqual([['mine']]);
    const listed = await raw.send([Q(PREPARED)]);
    expect(listed.rows).toEqual([]);
    expect((await db.pool.query('SELECT v FROM public.seen WHERE id = $1', [n])).rows).toEqual([{ v: 'mine' }]);
    raw.close();
  });
});

describe('ParameterStatus (raw protocol)', () => {
  test("the startup fence announces nothing after the greeting; the writer's own SET is announced", async ({ sql }) => {
    const raw = await RawClient.connect(sql.port, sql.database, 'unseen-status', fenceOptions(1, 'unseen/status'));
    // The connection was fenced before its greeting: its first transaction is the writer's alone.
    const first = await raw.send([Q('SELECT 1')]);
    expect(first.errors).toEqual([]);
    expect(first.parameters).toEqual([]);
    const set = await raw.send([Q("SET application_name = 'unseen-status-app'")]);
    expect(set.parameters).toEqual([['application_name', 'unseen-status-app']]);
    raw.close();
  });
});

describe('psycopg 3', () => {
  test("prepared and unprepared statements, in and out of a pipeline: pg_prepared_statements lists psycopg's own names only", async ({
    db,
    sql,
  }) => {
    const [a, b] = [id(), id()];
    const program = `import sys, psycopg
url, options, a, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with psycopg.connect(url, options=options, autocommit=True) as conn:
    for i in range(3):
        conn.execute("SELECT %s::int", [i], prepare=True)
    conn.execute("INSERT INTO public.seen VALUES (%s, 'psycopg')", [a])
    with conn.pipeline():
        conn.execute("INSERT INTO public.seen VALUES (%s, 'pipeline')", [b], prepare=True)
        conn.execute("SELECT 1")
    names = [r[0] for r in conn.execute("SELECT name FROM pg_catalog.pg_prepared_statements")]
    print(len(names), ",".join(n for n in names if not n.startswith("_pg3_")))
`;
    const { stdout } = await run('/usr/bin/python3', [
      '-c',
      program,
      sql.url('unseen-psycopg'),
      fenceOptions(1, 'unseen/psycopg'),
      String(a),
      String(b),
    ]);
    const [count, foreign] = stdout.trim().split(' ');
    expect(Number(count)).toBeGreaterThanOrEqual(2);
    expect(foreign ?? '').toBe('');
    expect((await db.pool.query('SELECT count(*)::int AS n FROM public.seen WHERE id = ANY($1)', [[a, b]])).rows[0].n).toBe(2);
  });
});
