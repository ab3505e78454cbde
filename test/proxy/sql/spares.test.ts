// Spare backends (src/proxy/sql/spares.ts): after a connect, the endpoint logs in a backend with the
// same startup ahead of the next one. Invariants: a spare serves only a connect whose startup
// (login, parameters, settings: token and fence key among them) is the same; it is fenced at
// nothing until a writer takes it, then fenced there as a new backend would be (a stale token is
// refused on it); one ended while it waits is never handed out; none outlives the endpoint.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, type SqlProxy } from '../../support/sql.ts';

let db: TestDatabase;
let role: string;

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query('CREATE TABLE public.sp_rows (id int PRIMARY KEY, v text)');
});
afterAll(async () => {
  await db?.drop();
});

const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );

/** Backends of the client login that no writer's fence registered: spares (and sessions not fenced). */
async function unregistered(): Promise<number[]> {
  const { rows } = await db.pool.query<{ pid: number }>(
    `SELECT a.pid FROM pg_stat_activity a WHERE a.usename = $1 AND a.backend_type = 'client backend'
       AND NOT EXISTS (SELECT FROM fencepost.fenced_backends b WHERE b.pid = a.pid) ORDER BY a.pid`,
    [role],
  );
  return rows.map((r) => r.pid);
}

async function until<T>(what: string, read: () => Promise<T>, ok: (v: T) => boolean): Promise<T> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const v = await read();
    if (ok(v)) return v;
    if (Date.now() > deadline) throw new Error(`${what}: still ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const now = async () => (await db.pool.query<{ t: Date }>('SELECT clock_timestamp() AS t')).rows[0]!.t;
const startedBefore = async (pid: number, t: Date) =>
  (await db.pool.query<{ before: boolean }>('SELECT backend_start < $2 AS before FROM pg_stat_activity WHERE pid = $1', [pid, t])).rows[0]
    ?.before;
const backendPid = async (c: pg.Client) => (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;

describe('with spares (the default)', () => {
  let sql: SqlProxy;
  beforeAll(async () => {
    sql = await startSqlProxy(db);
    role = clientRoleFor(db.url);
    await db.pool.query(`GRANT SELECT, INSERT ON public.sp_rows TO ${role}`);
  });
  afterAll(async () => {
    await sql?.close();
  });

  test('a connect like the last one is served by a backend logged in before it began, and is fenced there at its token', async () => {
    const first = await sql.connect('sp-writer', { options: fenceOptions(1, 'sp/a') });
    const [spare] = await until('a spare', unregistered, (p) => p.length === 1);
    const mark = await now();
    const second = await sql.connect('sp-writer', { options: fenceOptions(1, 'sp/a') });
    const pid = await backendPid(second);
    expect(pid).toBe(spare);
    expect(await startedBefore(pid, mark)).toBe(true);
    const registry = await db.pool.query('SELECT fence_key, token::text FROM fencepost.fenced_backends WHERE pid = $1', [pid]);
    expect(registry.rows).toEqual([{ fence_key: 'sp/a', token: '1' }]);
    await second.query(`INSERT INTO sp_rows VALUES (1, 'on a spare')`);
    await Promise.all([first.end(), second.end()]);
  });

  test('a connect with another startup (application_name, token) never takes it', async () => {
    const first = await sql.connect('sp-other', { options: fenceOptions(1, 'sp/b') });
    const [spare] = await until('a spare', unregistered, (p) => p.length >= 1);
    const mark = await now();
    const other = new pg.Client({ connectionString: sql.url('sp-other'), options: fenceOptions(1, 'sp/b'), application_name: 'another' });
    await other.connect();
    const pid = await backendPid(other);
    expect(pid).not.toBe(spare);
    expect(await startedBefore(pid, mark)).toBe(false);
    expect(await unregistered()).toContain(spare);
    await Promise.all([first.end(), other.end()]);
  });

  test('a spare ended while it waits is never handed out: the connect gets a new backend', async () => {
    const first = await sql.connect('sp-ended', { options: fenceOptions(1, 'sp/c') });
    const spares = await until('a spare', unregistered, (p) => p.length >= 1);
    for (const pid of spares) await db.pool.query('SELECT pg_terminate_backend($1)', [pid]);
    await until('spares gone', unregistered, (p) => p.every((pid) => !spares.includes(pid)));
    const mark = await now();
    const next = await sql.connect('sp-ended', { options: fenceOptions(1, 'sp/c') });
    const pid = await backendPid(next);
    expect(spares).not.toContain(pid);
    expect(await startedBefore(pid, mark)).toBe(false);
    await next.query(`INSERT INTO sp_rows VALUES (3, 'after the spare went')`);
    await Promise.all([first.end(), next.end()]);
  });

  test('a spare of an older token, taken after a raise, is refused FP409 at connect like a new backend', async () => {
    const old = await sql.connect('sp-stale', { options: fenceOptions(1, 'sp/d') });
    old.on('error', () => {});
    await until('a spare', unregistered, (p) => p.length >= 1);
    const leader = await sql.connect('sp-stale', { options: fenceOptions(2, 'sp/d') }); // raises sp/d to 2
    const zombie = new pg.Client({ connectionString: sql.url('sp-stale'), options: fenceOptions(1, 'sp/d') });
    expect(await code(zombie.connect())).toBe('FP409');
    expect(await code(leader.query(`INSERT INTO sp_rows VALUES (4, 'the leader')`))).toBe('ok');
    await leader.end();
    await old.end().catch(() => {});
  });

  test('closing the endpoint ends its spares', async () => {
    const existing = await unregistered();
    const own = await startSqlProxy(db);
    const c = await own.connect('sp-close', { options: fenceOptions(1, 'sp/e') });
    const mine = await until(
      'a spare of its own',
      async () => (await unregistered()).filter((pid) => !existing.includes(pid)),
      (p) => p.length >= 1,
    );
    await c.end();
    await own.close();
    await until('its spares ended', unregistered, (p) => mine.every((pid) => !p.includes(pid)));
  });
});

test('FENCEPOST_PGWIRE_SPARE_BACKENDS=0 keeps none', async () => {
  const sql = await startSqlProxy(db, { FENCEPOST_PGWIRE_SPARE_BACKENDS: '0' });
  role = clientRoleFor(db.url);
  try {
    await until('no backend of the earlier endpoints', unregistered, (p) => p.length === 0);
    const c = await sql.connect('sp-none', { options: fenceOptions(1, 'sp/f') });
    await c.query('SELECT 1');
    await new Promise((r) => setTimeout(r, 1000));
    expect(await unregistered()).toEqual([]);
    await c.end();
  } finally {
    await sql.close();
  }
});
