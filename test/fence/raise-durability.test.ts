// The durability attack loses no raise. A key holder turns its login's (and the database's)
// synchronous_commit off; a new leader's first write at token 2 raises the fence; the instant the
// raise is acknowledged, Postgres is SIGKILLed (postmaster and children, no checkpoint) and started
// again on the same data dir. Invariant: the fence is still at 2 after recovery, and a token-1
// write is refused. On every door: the SQL endpoint (the session's gate raises), POST
// /v1/transactions (the runner raises on FP428) and PUT /v1/fences (the store's statement).
//
// The writer's own transaction never commits in these rounds (ROLLBACK on the SQL endpoint, a
// failing statement on /v1/transactions), so no commit of the writer's flushes the raise's WAL for
// it: the raise is durable on its own commit, or not at all.
//
// The test Postgres is this file's own (it is crashed), with wal_writer_delay=10s (the maximum):
// an asynchronous commit then waits up to 10 s in Postgres's WAL buffers before the WAL writer
// writes it, so a kill right after its acknowledgement loses it even on a loaded machine (with the
// default 200 ms the controls lost 18 of 18 commits too, on an idle one). The controls show the crash does
// lose asynchronous commits here (a plain INSERT by the client login, and the raise statement
// itself committed with synchronous_commit off), so the rounds would fail if a raise committed
// asynchronously. autovacuum and timed checkpoints are off so that nothing else flushes the WAL
// meanwhile; the controls run with no proxy up (its count folding commits synchronously, which
// would flush everything before it).
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import { migrate } from '../../src/fence/migrate.ts';
import { raiseFencesQuery } from '../../src/fence/sql/fences.ts';
import { startCrashablePostgres, type CrashablePostgres } from '../support/crashable-postgres.ts';
import { clientRoleFor, withDatabase, type TestDatabase } from '../support/db.ts';
import { fenceOptions, startSqlProxy, type SqlProxy } from '../support/sql.ts';

const ROUNDS = 3;
/** Tries of each control; one loss is enough to show the window (all of them are lost, in practice). */
const CONTROL_TRIES = 3;

let server: CrashablePostgres;
let url: string;
let database: string;
let login: string;

beforeAll(async () => {
  server = await startCrashablePostgres([
    '-c',
    'wal_writer_delay=10s',
    '-c',
    'autovacuum=off',
    '-c',
    'checkpoint_timeout=1d',
    '-c',
    'max_connections=100',
  ]);
  database = 'fp_durable';
  await query(server.url, `CREATE DATABASE ${database}`);
  url = withDatabase(server.url, database);
  login = clientRoleFor(url);
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  await migrate(pool);
  await pool.end();
  await query(url, 'CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  // The client login exists once a proxy has provisioned it.
  const proxy = await startProxy();
  await proxy.close();
  await query(url, `GRANT SELECT, INSERT ON public.items TO ${login}`);
}, 120_000);

afterAll(async () => {
  await server?.destroy();
});

/** One statement on a connection of its own (the server is crashed between tests: no pool survives it). */
async function query<R extends pg.QueryResultRow>(connectionString: string, text: string, values: unknown[] = []): Promise<R[]> {
  const c = new pg.Client({ connectionString });
  c.on('error', () => {});
  await c.connect();
  try {
    return (await c.query<R>(text, values)).rows;
  } finally {
    await c.end();
  }
}

const fenceOf = async (fenceKey: string) =>
  (await query<{ t: string }>(url, 'SELECT highest_token::text AS t FROM fencepost.fences WHERE fence_key = $1', [fenceKey]))[0]?.t ?? null;

function startProxy(): Promise<SqlProxy> {
  const db: TestDatabase = { url, pool: undefined as never, drop: async () => {} };
  return startSqlProxy(db);
}

/** The attack: the client login's and the database's default synchronous_commit off. */
async function weakenDurability(): Promise<void> {
  await query(url, `ALTER ROLE ${login} SET synchronous_commit = off`);
  await query(url, `ALTER DATABASE ${database} SET synchronous_commit = off`);
  // In force: a new session of the login gets off.
  const password = (await query<{ password: string }>(url, 'SELECT password FROM fencepost.client_logins WHERE login = $1', [login]))[0]!
    .password;
  expect(await query<{ s: string }>(loginUrl(password), "SELECT current_setting('synchronous_commit') AS s")).toEqual([{ s: 'off' }]);
}

function loginUrl(password: string): string {
  const u = new URL(url);
  u.username = login;
  u.password = password;
  return u.toString();
}

/** Kills Postgres right after an acknowledged write, then starts it again (WAL recovery). */
async function crashAndRecover(proxy: SqlProxy | null): Promise<void> {
  await server.kill();
  // Closed only after the kill: nothing the proxy does on the way out reaches the old server.
  await proxy?.close();
  await server.restart();
}

const put = (proxy: SqlProxy, path: string, token: number, headers: Record<string, string> = {}) =>
  fetch(`${proxy.proxy.url}${path}`, { method: 'PUT', headers: { 'fencing-token': String(token), ...headers }, body: 'x' });

type Door = (proxy: SqlProxy, fenceKey: string, id: number) => Promise<void>;

/** Each door's first write at token 2, acknowledged: the fence is at 2 when it returns. */
const doors: Record<string, Door> = {
  'the SQL endpoint': async (proxy, fenceKey, id) => {
    const c = await proxy.connect('new-leader', { options: fenceOptions(2, fenceKey) });
    try {
      await c.query('BEGIN');
      // Passing the fence inside the transaction means the gate's raise committed before it.
      await c.query('INSERT INTO public.items VALUES ($1, $2)', [id, 'token 2']);
      await c.query('ROLLBACK');
    } finally {
      await c.end();
    }
  },
  'POST /v1/transactions': async (proxy, fenceKey, id) => {
    const res = await fetch(`${proxy.proxy.url}/v1/transactions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        fences: [{ key: fenceKey, token: '2' }],
        statements: [{ sql: 'INSERT INTO public.items VALUES ($1, $2)', params: [id, 'token 2'] }, { sql: 'SELECT 1 / 0' }],
      }),
    });
    // Refused by its second statement, after the fence passed at 2: the runner's raise stands.
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error: 'sql_error', sqlState: '22012', statement: 1 });
  },
  'PUT /v1/fences': async (proxy, fenceKey) => {
    const res = await put(proxy, `/v1/fences/${encodeURIComponent(fenceKey)}`, 2);
    expect(res.status).toBe(200);
  },
};

describe('a raise acknowledged under synchronous_commit=off for the login and the database survives a Postgres crash right after it', () => {
  let nextId = 1;
  for (const [door, raise] of Object.entries(doors)) {
    test(`${door}: after each of ${ROUNDS} crashes the fence is still at 2 and a token-1 write is refused`, async () => {
      let proxy = await startProxy();
      try {
        for (let round = 0; round < ROUNDS; round++) {
          const fenceKey = `durable/${door.replace(/[^a-z]+/gi, '-')}/${round}`;
          expect((await put(proxy, `/v1/fences/${encodeURIComponent(fenceKey)}`, 1)).status).toBe(200);
          await weakenDurability();
          await raise(proxy, fenceKey, nextId++);
          await crashAndRecover(proxy);
          expect(await fenceOf(fenceKey), `round ${round}`).toBe('2');
          proxy = await startProxy(); // its start resets the login's role settings; the next round weakens them again
          const stale = await put(proxy, `/v1/objects/${encodeURIComponent(fenceKey)}/o`, 1, { 'fence-key': fenceKey });
          expect(stale.status, `round ${round}`).toBe(409);
          expect(await stale.json()).toMatchObject({ error: 'stale_token', highestToken: '2' });
        }
      } finally {
        await proxy.close();
        await query(url, `ALTER DATABASE ${database} RESET synchronous_commit`);
      }
    }, 180_000);
  }
});

describe('controls: this crash loses asynchronous commits, so the rounds above would catch an asynchronous raise', () => {
  // No proxy runs here (its synchronous commits would flush the WAL these commits wait in).
  test('a plain INSERT by the client login with its role-level synchronous_commit off is lost', async () => {
    let lost = 0;
    for (let i = 0; i < CONTROL_TRIES; i++) {
      await weakenDurability();
      const password = (
        await query<{ password: string }>(url, 'SELECT password FROM fencepost.client_logins WHERE login = $1', [login])
      )[0]!.password;
      const id = 100_000 + i;
      await query(loginUrl(password), 'INSERT INTO public.items VALUES ($1, $2)', [id, 'async']); // acknowledged
      await crashAndRecover(null);
      if ((await query(url, 'SELECT 1 FROM public.items WHERE id = $1', [id])).length === 0) lost++;
    }
    await query(url, `ALTER ROLE ${login} RESET ALL`);
    await query(url, `ALTER DATABASE ${database} RESET synchronous_commit`);
    expect(lost).toBeGreaterThan(0);
  }, 120_000);

  test('the raise statement itself, committed with synchronous_commit off, is lost: the fence goes back to 1', async () => {
    let lost = 0;
    for (let i = 0; i < CONTROL_TRIES; i++) {
      const fenceKey = `control/raise/${i}`;
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      await c.query(raiseFencesQuery([{ fenceKey, token: 1n }], null)); // synchronous: the fence at 1 is durable
      await c.query('BEGIN; SET LOCAL synchronous_commit = off');
      await c.query(raiseFencesQuery([{ fenceKey, token: 2n }], null));
      await c.query('COMMIT'); // acknowledged
      c.on('error', () => {});
      await crashAndRecover(null);
      await c.end().catch(() => {});
      const highest = await fenceOf(fenceKey);
      expect(['1', '2']).toContain(highest);
      if (highest === '1') lost++;
    }
    expect(lost).toBeGreaterThan(0);
  }, 120_000);
});
