// Client SQL can harm nothing, whatever its text: it runs on a login that owns nothing, is a member
// of its key's role only, and reaches the fence only through the proxy's capability. These tests
// drive the TransactionRunner directly, past the route's friendly text check, so nothing here
// depends on reading SQL text; the property test at the end goes through HTTP.
import { afterAll, beforeAll, describe, expect, onTestFinished, test, vi } from 'vitest';
import fc from 'fast-check';
import pg from 'pg';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../support/db.ts';
import { adminQuery, bearer, SECRET, securedApp, uniqueRole } from '../support/keys.ts';
import type { TransactionSettings, TxResult } from '../../src/fence/transaction.ts';
import { Fence } from '../../src/fence/fence.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { loginName } from '../../src/fence/client-logins.ts';
import { sessionFenceCapability } from '../../src/fence/sql/rule.ts';

let db: TestDatabase;
let runner: Fence;
let app: FastifyInstance;
const role = uniqueRole('csql');
const otherRole = uniqueRole('csqlo');
let owner: string;

beforeAll(async () => {
  db = await createTestDatabase();
  owner = (await db.pool.query<{ u: string }>('SELECT current_user AS u')).rows[0]!.u;
  await adminQuery(`CREATE ROLE ${role} NOLOGIN; CREATE ROLE ${otherRole} NOLOGIN`);
  await db.pool.query(`
    CREATE SCHEMA app;
    CREATE TABLE app.items (id int PRIMARY KEY, v text);
    CREATE TABLE app.other (id int PRIMARY KEY);
    GRANT USAGE ON SCHEMA app TO ${role}, ${otherRole};
    GRANT SELECT, INSERT, UPDATE, DELETE ON app.items TO ${role};
    GRANT SELECT, INSERT ON app.other TO ${otherRole};
    CREATE FUNCTION app.raise(state text) RETURNS int LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'raised %', state USING ERRCODE = state; END $$;
    GRANT EXECUTE ON FUNCTION app.raise(text) TO ${role};
  `);
  // A fence of another tenant, which nothing below may lower or raise.
  await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('o/victim', 100)`);
  runner = fenceOf(runnerOptions());
  app = securedApp(db.pool, role);
  await app.ready();
});

/** The file's fence: the two keys' client logins, and /v1/transactions run as `transactions` says. */
function fenceOf(transactions: TransactionSettings): Fence {
  return new Fence({
    store: new FenceStore(db.pool, STORE_DEFAULTS),
    transactions,
    clientRole: clientRoleFor(db.url),
    logins: [
      { keyName: 'writer', pgRole: role },
      { keyName: 'other', pgRole: otherRole },
    ],
    lockTimeoutMs: 500,
    raiseWaitMs: 1000,
    provisionRetryMs: 5000,
  });
}

/** The file's transaction settings: small timeouts, so the tests of timeouts run quickly. */
function runnerOptions(): TransactionSettings {
  return {
    database: db.url,
    maxConcurrent: 4,
    statementTimeoutMs: 2000,
    lockTimeoutMs: 500,
    maxConcurrentPerKey: 4,
    transactionTimeoutMs: 3000,
    maxResultBytes: 64 * 1024,
    retries: 1,
  };
}

afterAll(async () => {
  await runner.close();
  await app.close();
  await db.drop();
  await adminQuery(`DROP ROLE IF EXISTS ${role}; DROP ROLE IF EXISTS ${otherRole}`);
});

async function run(statements: string[], token = 1n): Promise<TxResult | Error> {
  try {
    return await runner.transact(
      'writer',
      [{ fenceKey: 'w/attack', token }],
      statements.map((sql) => ({ sql, params: [] })),
      { isolation: 'read committed', writerId: 'attacker' },
    );
  } catch (err) {
    return err as Error;
  }
}

/** The fence is as it was: the victim's fence at 100, every trigger enabled. */
async function fenceIntact(): Promise<void> {
  const { rows } = await db.pool.query(`SELECT highest_token FROM fencepost.fences WHERE fence_key = 'o/victim'`);
  expect(rows[0]?.highest_token).toBe('100');
  const triggers = await db.pool.query(
    `SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'fencepost.fences'::regclass AND NOT tgisinternal`,
  );
  expect(triggers.rows.length).toBe(4);
  for (const t of triggers.rows) expect(t.tgenabled, t.tgname).toBe('O');
}

const whoami = 'SELECT current_user::text AS current_user, session_user::text AS session_user';

describe('the login and its role', () => {
  test("a key's statements run as its pgRole on its own login, which is no superuser and owns nothing", async () => {
    const r = await run([whoami, `SELECT rolsuper, rolcreaterole, rolbypassrls, rolinherit FROM pg_roles WHERE rolname = session_user`]);
    expect(r).toMatchObject({ committed: true });
    const res = (r as Extract<TxResult, { committed: true }>).results;
    expect(res[0]!.rows[0]).toEqual({ current_user: role, session_user: loginName(clientRoleFor(db.url), 'writer') });
    expect(res[1]!.rows[0]).toEqual({ rolsuper: false, rolcreaterole: false, rolbypassrls: false, rolinherit: false });
    const owned = await db.pool.query(
      `SELECT count(*)::int AS n FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = $1`,
      [res[0]!.rows[0]!.session_user],
    );
    expect(owned.rows[0].n).toBe(0);
  });

  test("each key's login is a member of its own pgRole and no other", async () => {
    const { rows } = await db.pool.query(
      `SELECT l.rolname AS login, array_agg(r.rolname::text ORDER BY r.rolname) AS roles
       FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles l ON l.oid = m.member
       WHERE l.rolname = ANY($1) GROUP BY l.rolname ORDER BY l.rolname`,
      [[loginName(clientRoleFor(db.url), 'writer'), loginName(clientRoleFor(db.url), 'other')]],
    );
    expect(rows).toEqual([
      { login: loginName(clientRoleFor(db.url), 'other'), roles: [otherRole] },
      { login: loginName(clientRoleFor(db.url), 'writer'), roles: [role] },
    ]);
  });
});

describe("nothing of schema fencepost can be named by a key's login or role", () => {
  // Invariant: DDL that Postgres locks before it checks ownership (CREATE RULE, CREATE TRIGGER,
  // a REFERENCES) would queue its lock behind any open transaction and stall every tenant's fence
  // behind it. Refused at the schema's name lookup, it takes no lock at all: "permission denied
  // for schema fencepost", never "must be owner", never a lock timeout. The registry of fenced
  // connections and its serial too.
  test("every table, view and sequence of the fence (the connection registry included): refused at the name, as the key's role and as its login", async () => {
    // A fenced connection: its row in the registry.
    expect(await run(['SELECT 1'], 1n)).toMatchObject({ committed: true });
    const { rows } = await db.pool.query<{ name: string }>(
      `SELECT format('%I.%I', n.nspname, c.relname) AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname = 'fencepost' AND c.relkind IN ('r', 'p', 'v', 'S') ORDER BY 1`,
    );
    expect(rows.map((r) => r.name)).toEqual(expect.arrayContaining(['fencepost.fenced_backends', 'fencepost.session_serial']));
    for (const { name } of rows) {
      for (const ddl of [
        `CREATE RULE r AS ON INSERT TO ${name} DO INSTEAD NOTHING`,
        `CREATE TRIGGER t BEFORE INSERT ON ${name} EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger()`,
        `LOCK TABLE ${name} IN ACCESS SHARE MODE`,
        `COMMENT ON TABLE ${name} IS 'x'`,
      ]) {
        for (const asLogin of [false, true]) {
          const r = await run(asLogin ? ['RESET ROLE', ddl] : [ddl]);
          expect(r, `${ddl}${asLogin ? ' (as the login)' : ''}`).toBeInstanceOf(Error);
          expect((r as Error).message, ddl).toMatch(/permission denied for schema fencepost/);
        }
      }
    }
    const usage = await db.pool.query<{ r: string }>(
      `SELECT r.rolname AS r FROM pg_roles r WHERE r.rolname = ANY($1) AND has_schema_privilege(r.oid, 'fencepost', 'USAGE')`,
      [[role, otherRole, loginName(clientRoleFor(db.url), 'writer'), loginName(clientRoleFor(db.url), 'other')]],
    );
    expect(usage.rows).toEqual([]);
    await fenceIntact();
  });

  // Invariant: a connection fenced at an older token does not outlive a raise of its fence. Its
  // transaction open when the raise comes (asleep, then about to write) is ended with its backend
  // before the raise commits, and nothing of it lands; the registry keeps no row of it.
  test("a fenced connection's open transaction is ended by its fence's raise, and nothing of it lands", async () => {
    await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('o/raised', 5)`);
    const sleeping = runner
      .transact(
        'writer',
        [{ fenceKey: 'o/raised', token: 5n }],
        [`SELECT pg_sleep(2.5)`, `INSERT INTO app.items VALUES (77, 'after the raise')`].map((sql) => ({ sql, params: [] })),
        { isolation: 'read committed', writerId: 'old' },
      )
      .catch((err: unknown) => err as Error);
    await vi.waitFor(
      async () => {
        const { rows } = await db.pool.query(
          `SELECT 1 FROM fencepost.fenced_backends b JOIN pg_stat_activity a ON a.pid = b.pid WHERE b.fence_key = 'o/raised' AND a.query LIKE '%pg_sleep%'`,
        );
        expect(rows.length).toBe(1);
      },
      { timeout: 5000, interval: 20 },
    );
    expect(await runner.raiseOne('o/raised', 6n, null)).toBe(6n);
    const ended = await sleeping;
    expect(ended).toMatchObject({ committed: false, stale: [{ fenceKey: 'o/raised', token: 5n, highestToken: 6n }] });
    expect((await db.pool.query(`SELECT count(*)::int AS n FROM app.items WHERE id = 77`)).rows[0].n).toBe(0);
    expect(
      (await db.pool.query(`SELECT count(*)::int AS n FROM fencepost.fenced_backends WHERE fence_key = 'o/raised' AND token < 6`)).rows[0]
        .n,
    ).toBe(0);
  });
});

describe('role escapes end in a role that can harm nothing', () => {
  // Each escape, then the harm it was after. Whatever the escape did, the harm must fail.
  const escapes = [
    'RESET ROLE',
    `SELECT set_config('role', session_user, true)`,
    `SELECT U&"\\0073et_config"('role', session_user, true)`,
    `DO $$ BEGIN EXECUTE 'RESET ROLE'; END $$`,
    `UPDATE pg_settings SET setting = session_user WHERE name = 'role'`,
    'PREPARE esc AS SELECT 1',
  ];
  const harms = [
    `ALTER TABLE fencepost.fences DISABLE TRIGGER ALL`,
    `UPDATE fencepost.fences SET highest_token = 0 WHERE fence_key = 'o/victim'`,
    `DELETE FROM fencepost.fences WHERE fence_key = 'o/victim'`,
    `SELECT * FROM fencepost.client_logins`,
    `COPY (SELECT 1) TO PROGRAM 'true'`,
    `INSERT INTO app.other VALUES (1)`,
  ];
  test.each(escapes.flatMap((e) => harms.map((h) => [e, h] as const)))('%s, then %s: refused, fence intact', async (escape, harm) => {
    const r = await run([escape, harm]);
    expect(r).toBeInstanceOf(Error);
    await fenceIntact();
    expect((await db.pool.query('SELECT count(*)::int AS n FROM app.other')).rows[0].n).toBe(0);
  });

  test.each([
    [`SET ROLE ${'$owner'}`],
    [`SET SESSION AUTHORIZATION ${'$owner'}`],
    [`SELECT set_config('role', '${'$ownerName'}', true)`],
    [`SET ROLE ${'$other'}`],
    [`ALTER ROLE CURRENT_USER SUPERUSER`],
    [`ALTER ROLE SESSION_USER CREATEROLE`],
    [`CREATE ROLE fp_evil SUPERUSER`],
    [`GRANT ${'$owner'} TO SESSION_USER`],
    [`GRANT ${'$other'} TO SESSION_USER`],
  ])('%s is refused by Postgres itself', async (sqlTemplate) => {
    const sql = sqlTemplate.replaceAll('$ownerName', owner).replaceAll('$owner', `"${owner}"`).replaceAll('$other', otherRole);
    const r = await run([sql]);
    expect(r).toBeInstanceOf(Error);
    expect(((r as Error).cause as { code?: string } | undefined)?.code, String(r)).toBe('42501');
    await fenceIntact();
  });

  test("calling the fence function from client SQL without the proxy's capability is refused: no fence raised", async () => {
    const r = await run([
      `SELECT * FROM fencepost.fence_transaction('guess', ARRAY['o/victim', 'o/new'], ARRAY[999999, 5]::bigint[], NULL)`,
    ]);
    expect(r).toBeInstanceOf(Error);
    await fenceIntact();
    expect((await db.pool.query(`SELECT 1 FROM fencepost.fences WHERE fence_key = 'o/new'`)).rowCount).toBe(0);
  });
});

describe("the proxy's own statements take nothing from the writer", () => {
  test('a type shadowed in pg_temp and parameters logged in errors never expose the capability', async () => {
    // The attack of the review: shadow `text` in pg_temp with a domain whose check raises its input,
    // and turn on bind parameters in error reports, so a proxy statement with a ::text cast would
    // leak the capability. The proxy's statements have no casts and no parameters after the fence.
    const { capability } = await runner.provision();
    const r = await run([
      `SELECT U&"\\0073et_config"('log_parameter_max_length_on_error', '-1', true)`,
      `CREATE FUNCTION pg_temp.leak(x pg_catalog.text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'leaked: %', x; END $$`,
      `CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (pg_temp.leak(VALUE))`,
    ]);
    const seen =
      r instanceof Error
        ? `${r.message} ${String((r.cause as Error | undefined)?.message)}`
        : JSON.stringify(r, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
    expect(seen).not.toContain(capability);
    expect(r).toMatchObject({ committed: true });
    // The temp objects are gone for the next transaction on the connection.
    expect(await run(['SELECT 1'])).toMatchObject({ committed: true });
  });
  test("settings that change how SQL text is read, left by one transaction, do not reach the next one's fence", async () => {
    // The proxy's first round trip is SQL text. A transaction leaves the session reading text as
    // SJIS without standard-conforming strings (a classic way to break out of a quoted literal);
    // the next transaction on that connection, with quotes, backslashes and non-ASCII in its fence
    // key and writer id, still fences exactly that key and sees the defaults again.
    const pid = async () =>
      ((await run(['SELECT pg_backend_pid() AS pid'])) as Extract<TxResult, { committed: true }>).results[0]!.rows[0]!.pid;
    const before = await pid();
    const dirty = await run([
      `SELECT pg_catalog.set_config('standard_conforming_strings', 'off', false), pg_catalog.set_config('backslash_quote', 'on', false)`,
      `SELECT pg_catalog.set_config('client_encoding', 'SJIS', false)`,
    ]);
    expect(dirty).toMatchObject({ committed: true });
    const key = "w/it's \\' ü表\\";
    const next = await runner.transact(
      'writer',
      [{ fenceKey: key, token: 7n }],
      [
        {
          sql: `SELECT pg_backend_pid() AS pid, current_setting('client_encoding') AS enc, current_setting('standard_conforming_strings') AS scs`,
          params: [],
        },
      ],
      {
        isolation: 'read committed',
        writerId: "o'neil \\ 表",
      },
    );
    expect(next.committed).toBe(true);
    expect((next as Extract<TxResult, { committed: true }>).results[0]!.rows[0]).toEqual({ pid: before, enc: 'UTF8', scs: 'on' });
    const { rows } = await db.pool.query(`SELECT highest_token, raised_by FROM fencepost.fences WHERE fence_key = $1`, [key]);
    expect(rows).toEqual([{ highest_token: '7', raised_by: "o'neil \\ 表" }]);
    await fenceIntact();
  });

  test('a session-fence capability works only on its own backend (its pid and its start) and for its own fence key and token', async () => {
    // A capability the proxy computed for one backend and one (fence key, token), presented for
    // another fence, or from another backend (another pid, or the same pid after a reconnect: the
    // backend's start differs), is refused before anything is read or locked.
    const { capability } = await runner.provision();
    const r = (await run([`SELECT pg_backend_pid() AS pid, fencepost_api.session_start() AS start`])) as Extract<
      TxResult,
      { committed: true }
    >;
    const here = { pid: r.results[0]!.rows[0]!.pid as number, start: r.results[0]!.rows[0]!.start as string };
    expect(here.start).toMatch(/^[0-9]{20}$/);
    const call = (cap: string) => `SELECT fencepost_api.fence_session('${cap}', 'o/victim', 100)`;
    const replayed = await run([call(sessionFenceCapability(capability, here, 'w/attack', 1n))]);
    expect(replayed).toBeInstanceOf(Error);
    expect(String((replayed as Error).message)).toMatch(/may be called by the proxy only/);
    const elsewhere = await run([call(sessionFenceCapability(capability, { ...here, pid: here.pid + 1 }, 'o/victim', 100n))]);
    expect(String((elsewhere as Error).message)).toMatch(/may be called by the proxy only/);
    // The same pid, a backend started a microsecond earlier: what a pid reused by a reconnect looks like.
    const earlier = String(BigInt(here.start) - 1n);
    const reused = await run([call(sessionFenceCapability(capability, { ...here, start: earlier }, 'o/victim', 100n))]);
    expect(String((reused as Error).message)).toMatch(/may be called by the proxy only/);
    // Oversized arguments are refused before anything is hashed, read or locked.
    const huge = await run([`SELECT fencepost_api.fence_session(repeat('a', 64), repeat('k', 2000000), 100)`]);
    expect(String((huge as Error).message)).toMatch(
      /argument too long \(capability 64 bytes, fence key 2000000 bytes; at most 64 and 1024\)/,
    );
    await fenceIntact();
  });
});

describe('statements that end the fenced transaction go no further', () => {
  test('COMMIT in the middle: nothing after it runs (no unfenced write)', async () => {
    const r = await run([`INSERT INTO app.items VALUES (1, 'fenced')`, 'COMMIT', `INSERT INTO app.items VALUES (2, 'unfenced')`]);
    expect(r).toBeInstanceOf(Error);
    expect((r as Error).name).toBe('TransactionEndedError');
    const ids = (await db.pool.query('SELECT id FROM app.items WHERE id IN (1, 2) ORDER BY id')).rows.map((x) => x.id);
    expect(ids).toEqual([1]); // committed with the fence, as COMMIT said; the rest never ran
  });

  test.each(['COMMIT AND CHAIN', 'ROLLBACK AND CHAIN'])(
    '%s then a write: the chained, unfenced transaction never commits',
    async (chain) => {
      // The chained transaction also lost SET LOCAL ROLE: its write fails on privileges, or, were it
      // allowed, the chain's command tag stops the runner, which rolls it back.
      const r = await run([chain, `INSERT INTO app.items VALUES (3, 'chained')`]);
      expect(r).toBeInstanceOf(Error);
      expect((await db.pool.query('SELECT 1 FROM app.items WHERE id = 3')).rowCount).toBe(0);
      const allowed = await run([chain, 'SELECT 1']);
      expect((allowed as Error).name).toBe('TransactionEndedError');
    },
  );

  test('COMMIT AND CHAIN, then the session fence with a guessed capability, then COMMIT AND CHAIN: no fence raised', async () => {
    const r = await run(['COMMIT AND CHAIN', `SELECT fencepost_api.fence_session('', 'o/victim', 999999)`, 'COMMIT AND CHAIN']);
    expect(r).toBeInstanceOf(Error);
    await fenceIntact();
  });
});

describe('no statement takes the process down or chooses the status', () => {
  test('a backend that dies mid-transaction: 503 unavailable, not committed, the proxy keeps serving', async () => {
    // Killed from outside, as a Postgres restart or the OOM killer would (the key's role may not
    // terminate even its own login's backend).
    const killer = (async () => {
      for (let i = 0; i < 100; i++) {
        const { rows } = await db.pool.query(
          `SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(20)' AND state = 'active'`,
        );
        if (rows.length > 0) return;
        await new Promise((res) => setTimeout(res, 20));
      }
    })();
    const patient = securedApp(db.pool, role, { transactions: { clientRole: clientRoleFor(db.url), statementTimeoutMs: 60_000 } });
    const res = await patient.inject({
      method: 'POST',
      url: '/v1/transactions',
      headers: { ...bearer(SECRET.writer), 'content-type': 'application/json' },
      payload: {
        fences: [{ key: 'w/die', token: '1' }],
        statements: [{ sql: `INSERT INTO app.items VALUES (10, 'x')` }, { sql: 'SELECT pg_sleep(20)' }],
      },
    });
    await killer;
    await patient.close();
    expect(res.statusCode).toBe(503);
    expect(res.json().error).toBe('unavailable');
    expect((await db.pool.query('SELECT 1 FROM app.items WHERE id = 10')).rowCount).toBe(0);
    // The raise, a transaction of the proxy's own before the writer's, did commit: nothing of the writer's did.
    expect((await db.pool.query(`SELECT highest_token FROM fencepost.fences WHERE fence_key = 'w/die'`)).rows).toEqual([
      { highest_token: '1' },
    ]);
    expect(await run(['SELECT 1'])).toMatchObject({ committed: true });
  });

  test.each(['XX000', '08006', '57P01', '58030'])(
    "a function raising %s on a live connection is the statement's error (4xx), not the database's",
    async (state) => {
      const res = await app.inject({
        method: 'POST',
        url: '/v1/transactions',
        headers: { ...bearer(SECRET.writer), 'content-type': 'application/json' },
        payload: { fences: [{ key: 'w/raise', token: '1' }], statements: [{ sql: 'SELECT app.raise($1)', params: [state] }] },
      });
      expect(res.statusCode).toBe(400);
      expect(res.json()).toMatchObject({ error: 'sql_error', sqlState: state, statement: 0 });
    },
  );

  test('results past the cap fail the transaction while streaming in, nothing applied', async () => {
    const before = process.memoryUsage().rss;
    const r = await run([`INSERT INTO app.items VALUES (11, 'x')`, `SELECT repeat('x', 1000) FROM generate_series(1, 2000000)`]);
    expect((r as Error).name).toBe('ResultTooLargeError');
    expect((await db.pool.query('SELECT 1 FROM app.items WHERE id = 11')).rowCount).toBe(0);
    // 2 GB of rows were asked for; far less than that was ever held.
    expect(process.memoryUsage().rss - before).toBeLessThan(512 * 1024 * 1024);
    expect(await run(['SELECT 1'])).toMatchObject({ committed: true });
  });

  test('a transaction past its deadline is terminated, whatever timeouts it lifted; nothing applied', async () => {
    const r = await run([`INSERT INTO app.items VALUES (12, 'x')`, 'SET LOCAL statement_timeout = 0', 'SELECT pg_sleep(30)']);
    expect((r as Error).name).toBe('TransactionTimeoutError');
    expect((await db.pool.query('SELECT 1 FROM app.items WHERE id = 12')).rowCount).toBe(0);
    // The backend is gone: no session of the login is still sleeping.
    for (let i = 0; i < 50; i++) {
      const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(30)%'`);
      if (rows[0].n === 0) break;
      await new Promise((res) => setTimeout(res, 100));
    }
    expect((await db.pool.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(30)%'`)).rows[0].n).toBe(
      0,
    );
  });

  test('a statement that weakens synchronous_commit cannot weaken the commit of its fence raise', async () => {
    const r = await run(['SET LOCAL synchronous_commit = off', `SELECT current_setting('synchronous_commit') AS s`]);
    expect(r).toMatchObject({ committed: true });
    // The seal before COMMIT forces it back on; visible in the same way a commit would see it.
    const seen = await runner.transact(
      'writer',
      [{ fenceKey: 'w/attack', token: 1n }],
      [{ sql: 'SET LOCAL synchronous_commit = off', params: [] }],
      { isolation: 'read committed', writerId: null },
    );
    expect(seen.committed).toBe(true);
  });

  test('session state does not outlive its transaction: settings, role and advisory locks are gone for the next', async () => {
    const first = await run([`SET search_path = app`, `SELECT pg_advisory_lock(42)`]);
    expect(first).toMatchObject({ committed: true });
    const next = await run([
      `SELECT current_setting('search_path') AS p, (SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS locks`,
    ]);
    expect((next as Extract<TxResult, { committed: true }>).results[0]!.rows[0]).toEqual({ p: '"$user", public', locks: 0 });
  });
});

describe('the pooled session', () => {
  test.each(['read committed', 'repeatable read', 'serializable'] as const)(
    '%s: the transaction runs at that isolation level (the session reset before it takes snapshots of its own)',
    async (isolation) => {
      const r = await runner.transact(
        'writer',
        [{ fenceKey: 'w/iso', token: 1n }],
        [{ sql: `SELECT current_setting('transaction_isolation') AS iso`, params: [] }],
        { isolation, writerId: null },
      );
      expect((r as Extract<TxResult, { committed: true }>).results[0]!.rows[0]).toEqual({ iso: isolation });
    },
  );

  test('a transaction that leaves its session unable to reset (a 1 ms statement timeout, 300,000 settings) costs later transactions nothing: the session is dropped, another one serves', async () => {
    // RESET ALL, the first statement of the next transaction's first round trip, then runs past
    // the timeout the session carries; the whole Query rolls back, its reset too. Put back in the
    // pool, that connection would fail every later transaction of the key.
    // A runner of its own with patient timeouts: 300,000 settings can take seconds on a loaded
    // box, past the file runner's transaction deadline.
    const patient = fenceOf({ ...runnerOptions(), statementTimeoutMs: 30_000, transactionTimeoutMs: 60_000 });
    onTestFinished(() => patient.close());
    const run = (statements: string[]) =>
      patient
        .transact(
          'writer',
          [{ fenceKey: 'w/attack', token: 1n }],
          statements.map((sql) => ({ sql, params: [] })),
          { isolation: 'read committed', writerId: 'attacker' },
        )
        .catch((err: Error) => err);
    const pid = async () =>
      ((await run(['SELECT pg_backend_pid() AS pid'])) as Extract<TxResult, { committed: true }>).results[0]!.rows[0]!.pid as number;
    const poisoned = await pid();
    // The settings commit with the fenced transaction; the timeout is set in the chained one, which
    // its own COMMIT ends (the run stops there: TransactionEndedError, the connection is reused).
    const r = await run([
      `SELECT count(pg_catalog.set_config('x.v' || i, 'y', false)) FROM generate_series(1, 300000) i`,
      'COMMIT AND CHAIN',
      `SELECT pg_catalog.set_config('statement_timeout', '1', false)`,
      'COMMIT',
    ]);
    expect((r as Error).name).toBe('TransactionEndedError');
    for (let i = 0; i < 4; i++) {
      const honest = await patient.transact(
        'writer',
        [{ fenceKey: 'w/honest', token: 1n }],
        [{ sql: `INSERT INTO app.items VALUES ($1, 'honest')`, params: [900 + i] }],
        { isolation: 'read committed', writerId: 'honest' },
      );
      expect(honest.committed).toBe(true);
    }
    expect((await db.pool.query('SELECT count(*)::int AS n FROM app.items WHERE id BETWEEN 900 AND 903')).rows[0].n).toBe(4);
    // The dropped connection's backend exits once it reads the close: wait for it, do not race it.
    await expect
      .poll(async () => (await db.pool.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1', [poisoned])).rows[0].n)
      .toBe(0);
  });
});

describe('nothing of a transaction stays active while its connection waits in the pool', () => {
  // The next transaction resets the session before its statements; what acts on other sessions in
  // the meantime (a session advisory lock, a LISTEN) ends with the transaction itself.
  const held = async (key: number) =>
    (await db.pool.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND granted`, [key])).rows[0]
      .n as number;

  test("a committed transaction's session advisory lock ends with it", async () => {
    const r = await run([`SELECT pg_advisory_lock(4242)`]);
    expect(r).toMatchObject({ committed: true });
    expect(await held(4242)).toBe(0);
    // Another session may take the lock right away (it would wait were it still held).
    const other = await db.pool.connect();
    try {
      expect((await other.query(`SELECT pg_try_advisory_lock(4242) AS got`)).rows[0].got).toBe(true);
      await other.query(`SELECT pg_advisory_unlock(4242)`);
    } finally {
      other.release();
    }
  });

  test("so does a failed one's", async () => {
    const r = await run([`SELECT pg_advisory_lock(4243)`, `SELECT 1/0`]);
    expect(r).toBeInstanceOf(Error);
    expect(await held(4243)).toBe(0);
  });
});

describe('property: role changes in any spelling, through HTTP', () => {
  // Random comments, quoting, case and escapes around statements that try to leave the role. Each
  // transaction is either refused up front (400) or runs and fails on privileges; never does the
  // fence change or a trigger go off, and the proxy keeps answering.
  const pad = fc.constantFrom('', ' ', '\n', '\r', '\t', '/* c */', '/* /* nested */ */', '--c\r', '--c\n');
  const word = (w: string) => fc.constantFrom(w, w.toUpperCase(), w[0]!.toUpperCase() + w.slice(1));
  const attack = fc.oneof(
    fc.tuple(pad, word('reset'), pad, word('role')).map(([a, b, c, d]) => `${a}${b} ${c}${d}`),
    fc
      .tuple(pad, word('set'), pad, word('role'), fc.constantFrom(` "${'OWNER'}"`, ' none', ' session_user'))
      .map(([a, b, c, d, e]) => `${a}${b} ${c}${d}${e}`),
    fc
      .tuple(pad, fc.constantFrom('set_config', 'U&"\\0073et_config"', '"set_config"', 'pg_catalog.set_config', 'U&"set\\005fconfig"'))
      .map(([a, f]) => `${a}SELECT ${f}('role', session_user, true)`),
    fc
      .tuple(pad, fc.constantFrom(`'RESET ROLE'`, `$x$SET ROLE "OWNER"$x$`, `U&'\\0052ESET ROLE'`))
      .map(([a, s]) => `${a}DO $$ BEGIN EXECUTE ${s}; END $$`),
  );
  test('any spelling: 400 refused, or privileges refuse the harm; fence and triggers intact', async () => {
    await fc.assert(
      fc.asyncProperty(
        attack,
        fc.constantFrom(
          ...[
            'UPDATE fencepost.fences SET highest_token = 0',
            'ALTER TABLE fencepost.fences DISABLE TRIGGER ALL',
            'INSERT INTO app.other VALUES (2)',
          ],
        ),
        async (esc, harm) => {
          const sql = esc.replaceAll('OWNER', owner);
          const res = await app.inject({
            method: 'POST',
            url: '/v1/transactions',
            headers: { ...bearer(SECRET.writer), 'content-type': 'application/json' },
            payload: { fences: [{ key: 'w/prop', token: '1' }], statements: [{ sql }, { sql: harm }] },
          });
          expect([400, 403], `${sql} → ${res.body}`).toContain(res.statusCode);
          await fenceIntact();
        },
      ),
      { numRuns: 60 },
    );
    expect((await app.inject({ url: '/healthz' })).statusCode).toBe(200);
  });
});

test('the fence row lock of another transaction stalls a transaction no longer than the lock timeout', async () => {
  const holder = new pg.Client({ connectionString: db.url });
  await holder.connect();
  try {
    await holder.query('BEGIN');
    await holder.query(
      `INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('w/held', 1) ON CONFLICT (fence_key) DO UPDATE SET updated_at = now()`,
    );
    const r = await runner
      .transact('writer', [{ fenceKey: 'w/held', token: 1n }], [{ sql: 'SELECT 1', params: [] }], {
        isolation: 'read committed',
        writerId: null,
      })
      .catch((e: Error) => e);
    expect((r as Error).name).toBe('FenceBusyError');
  } finally {
    await holder.query('ROLLBACK');
    await holder.end();
  }
});

test("one key never takes every transaction slot: with two slots and a share of one, another key runs while the first key's second transaction waits", async () => {
  const fair = fenceOf({
    database: db.url,
    maxConcurrent: 2,
    maxConcurrentPerKey: 1,
    statementTimeoutMs: 5000,
    lockTimeoutMs: 500,
    transactionTimeoutMs: 8000,
    maxResultBytes: 64 * 1024,
    retries: 1,
  });
  try {
    const order: string[] = [];
    const tx = (key: string, fence: string, sql: string) =>
      fair
        .transact(key, [{ fenceKey: fence, token: 1n }], [{ sql, params: [] }], { isolation: 'read committed', writerId: key })
        .then((r) => {
          order.push(`${key}:${sql}`);
          return r;
        });
    const first = tx('writer', 'w/fair', 'SELECT pg_sleep(1.5)');
    const second = tx('writer', 'w/fair', 'SELECT 2');
    const other = tx('other', 'o/fair', 'SELECT 3');
    await Promise.all([first, second, other]);
    // The other key's transaction took the free slot; the writer's second waited for its first.
    expect(order).toEqual(['other:SELECT 3', 'writer:SELECT pg_sleep(1.5)', 'writer:SELECT 2']);
  } finally {
    await fair.close();
  }
});
