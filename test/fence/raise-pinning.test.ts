// Raise pinning (the issue's property 2): no role can make another fence key's raise fail or wait
// past FENCEPOST_RAISE_WAIT_MS + 500 ms. Two tenants on one proxy and one Postgres, set up as
// test/tenancy/isolation.test.ts sets them up (tools/tenancy/tenants.ts): A ("orders-writer",
// orders/, with a direct Postgres login that is a member of its pgRole) and B ("billing-writer",
// billing/). Each attack is made by a role that does not own the fence: A's direct login, A's
// SQL-endpoint session (its key's client login), or a stranger (a login with CONNECT only); then a
// raise of a fence key that is not the attacker's goes through, on each door (PUT /v1/fences, and
// the SQL endpoint, where a new leader's connection raises the fence at startup).
//
// Invariant of every test, "the raise goes through": the raise answered 200 (HTTP) or fenced the
// new leader's connection (SQL endpoint), and afterwards no backend that fencepost.fenced_backends
// registered at an older token of that key before the raise is alive (pid and backend start in
// pg_stat_activity), none of those rows is left, and the old leader's connection answers with an
// error. Timings (the raise's bound itself) are measured in `npm run bench`, not here; the raise
// waits 500 ms (FENCEPOST_RAISE_WAIT_MS) for the old leader's open transaction.
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { fenceOptions, fenceRow, startSqlProxy, type SqlProxy } from '../support/sql.ts';
import { createTenantRoles, createTenantTables, dropTenantRoles, tenantNames, type Tenant } from '../../tools/tenancy/tenants.ts';
import { protectTable } from '../../src/fence/protect.ts';
import { PROVISIONING_LOCK_KEY } from '../../src/fence/sql/logins.ts';
import { lock as migrationLock } from '../../src/fence/sql/migrations.ts';

const RAISE_WAIT_MS = 500;

type Door = 'http' | 'sql';
const DOORS: readonly Door[] = ['http', 'sql'];
const doorName = (door: Door) => (door === 'http' ? 'PUT /v1/fences' : "the SQL endpoint (a new leader's connection)");

/** A Postgres login of an attacker's, straight to the database. */
interface Login {
  login: string;
  password: string;
}

/** A backend fencepost.fenced_backends registered: pid and backend start name it for good. */
interface Backend {
  pid: number;
  started: string;
}

/** A leader of `fenceKey` at `token`, paused in an open transaction, and what was registered below the next token. */
interface PausedLeader {
  client: pg.Client;
  fenceKey: string;
  next: number;
  older: Backend[];
}

const tenants = tenantNames();
const { a: A, b: B } = tenants;
const tag = randomBytes(3).toString('hex');
const direct: Login = { login: tenants.direct.login, password: tenants.direct.password };
const stranger: Login = { login: `fp_rp_stranger_${tag}`, password: randomBytes(12).toString('hex') };
/** A table B's fence key protects that A's pgRole may write too: only the fence stands in A's way. */
const SHARED_B = 'public.rp_shared_b';

let db: TestDatabase;
let sql: SqlProxy;
/** Every connection a test opens, ended after it (a failed test leaves no lock behind). */
const opened: pg.Client[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  await createTenantRoles(db.pool, tenants);
  await db.pool.query(`CREATE ROLE ${stranger.login} LOGIN PASSWORD '${stranger.password}'`);
  sql = await startSqlProxy(db, { FENCEPOST_KEYS: tenants.keysJson, FENCEPOST_RAISE_WAIT_MS: String(RAISE_WAIT_MS) });
  await createTenantTables(db.pool, tenants);
  // Schemas the attackers own, for views that outlive their sessions.
  await db.pool.query(`CREATE SCHEMA rp_direct AUTHORIZATION ${direct.login}; CREATE SCHEMA rp_stranger AUTHORIZATION ${stranger.login}`);
  await db.pool.query(`CREATE TABLE ${SHARED_B} (id bigserial PRIMARY KEY, v text NOT NULL);
    GRANT INSERT ON ${SHARED_B} TO ${A.pgRole}, ${B.pgRole}; GRANT USAGE ON SEQUENCE ${SHARED_B}_id_seq TO ${A.pgRole}, ${B.pgRole}`);
  await protectTable(db.pool, SHARED_B, B.fenceKey);
});

afterEach(async () => {
  await Promise.all(opened.splice(0).map((c) => c.end().catch(() => {})));
  await rollbackPrepared();
});

afterAll(async () => {
  await sql?.close();
  if (db) {
    await rollbackPrepared(); // DROP DATABASE refuses a database with prepared transactions
    await dropTenantRoles(db.pool, tenants);
    await db.pool.query(`DROP OWNED BY ${stranger.login} CASCADE`).catch(() => {});
    await db.pool.query(`DROP ROLE IF EXISTS ${stranger.login}`).catch(() => {});
  }
  await db?.drop();
});

// ---- connections ------------------------------------------------------------------------------------

const code = (p: Promise<unknown>): Promise<string> =>
  p.then(
    () => 'ok',
    (e: { code?: string; message?: string }) => e.code ?? String(e.message ?? e),
  );

function track(c: pg.Client): pg.Client {
  c.on('error', () => {});
  opened.push(c);
  return c;
}

/** `who` straight to Postgres, past the proxy. */
async function connectDirect(who: Login): Promise<pg.Client> {
  const url = new URL(db.url);
  url.username = who.login;
  url.password = who.password;
  const c = track(new pg.Client({ connectionString: url.toString() }));
  await c.connect();
  return c;
}

/** A connection through the SQL endpoint as tenant `who`, fenced at `token` of `fenceKey`: it resolves once fenced. */
async function connectFenced(who: Tenant, fenceKey: string, token: number): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: sql.url(who.key, { password: who.secret, options: fenceOptions(token, fenceKey) }) });
  track(c);
  await c.connect();
  return c;
}

async function pidOf(c: pg.Client): Promise<number> {
  return (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
}

async function rollbackPrepared(): Promise<void> {
  const { rows } = await db.pool.query<{ gid: string }>('SELECT gid FROM pg_prepared_xacts WHERE database = current_database()');
  for (const { gid } of rows) await db.pool.query(`ROLLBACK PREPARED ${pg.escapeLiteral(gid)}`);
}

// ---- the raise and its check ----------------------------------------------------------------------

/** The backends registered at a token below `token` of `fenceKey`. */
async function registeredBelow(fenceKey: string, token: number): Promise<Backend[]> {
  const { rows } = await db.pool.query<Backend>(
    'SELECT pid, backend_start::text AS started FROM fencepost.fenced_backends WHERE fence_key = $1 AND token < $2 ORDER BY pid',
    [fenceKey, token],
  );
  return rows;
}

/** Those of `backends` still alive: the same pid with the same backend start. */
async function alive(backends: Backend[]): Promise<number[]> {
  const { rows } = await db.pool.query<{ pid: number }>(
    `SELECT a.pid FROM pg_stat_activity a JOIN unnest($1::int[], $2::text[]) AS r(pid, started)
       ON a.pid = r.pid AND a.backend_start = r.started::timestamptz`,
    [backends.map((b) => b.pid), backends.map((b) => b.started)],
  );
  return rows.map((r) => r.pid);
}

/** `who`'s leader at `token` of `fenceKey` (the fence raised to it), paused in an open transaction, as a zombie is. */
async function pausedLeader(who: Tenant, fenceKey: string, token = 1): Promise<PausedLeader> {
  const client = await connectFenced(who, fenceKey, token);
  await client.query('BEGIN');
  await client.query('SELECT 1');
  const older = await registeredBelow(fenceKey, token + 1);
  expect(older, 'the leader is registered, for the raise to end').toHaveLength(1);
  return { client, fenceKey, next: token + 1, older };
}

/** Raises `fenceKey` to `token` as tenant `who` through `door`: 'ok', or how it was refused. */
async function raise(door: Door, who: Tenant, fenceKey: string, token: number): Promise<string> {
  if (door === 'http') {
    const r = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${who.secret}`, 'fencing-token': String(token) },
      signal: AbortSignal.timeout(30_000),
    });
    const body = await r.text();
    return r.status === 200 && (JSON.parse(body) as { highestToken?: string }).highestToken === String(token)
      ? 'ok'
      : `${r.status} ${body}`;
  }
  // The endpoint fences a connection at startup or refuses it: connected means fenced at `token`.
  return await connectFenced(who, fenceKey, token).then(
    () => 'ok',
    (e: { code?: string; message?: string }) => `${e.code ?? ''} ${e.message ?? String(e)}`,
  );
}

/** The raise to `leader.next` went through: none of the older backends is alive or registered, and the old leader hears it. */
async function expectRevoked(leader: PausedLeader): Promise<void> {
  expect(await alive(leader.older)).toEqual([]);
  expect(await registeredBelow(leader.fenceKey, leader.next)).toEqual([]);
  expect(await code(leader.client.query('SELECT 1'))).not.toBe('ok');
}

// ---- what attackers can name ----------------------------------------------------------------------

/** Every relation and function of fencepost's schemas, by oid, as any role reads them from the catalog. */
async function fencepostOids(c: pg.Client): Promise<{ relations: string[]; functions: string[] }> {
  const { rows } = await c.query<{ kind: 'relation' | 'function'; oid: string }>(
    `SELECT 'relation' AS kind, c.oid::int8::text AS oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname IN ('fencepost', 'fencepost_api')
     UNION ALL
     SELECT 'function', p.oid::int8::text FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname IN ('fencepost', 'fencepost_api')`,
  );
  const of = (kind: string) => rows.filter((r) => r.kind === kind).map((r) => r.oid);
  return { relations: of('relation'), functions: of('function') };
}

/** The oid of a relation of fencepost's, read from pg_class as any role may. */
async function relationOid(c: pg.Client, name: string): Promise<string> {
  const { rows } = await c.query<{ oid: string }>(
    `SELECT c.oid::int8::text AS oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'fencepost' AND c.relname = $1`,
    [name],
  );
  return rows[0]!.oid;
}

/**
 * `CREATE VIEW <view>` over the pg_class and pg_proc rows of every object of fencepost's, each named
 * by a regclass or regprocedure constant of its oid (no lookup, no privilege: a dependency Postgres
 * records, and DROP would refuse for); answers how many of those objects the view depends on.
 */
async function pinByOid(c: pg.Client, view: string): Promise<{ dependsOn: number; of: number }> {
  const { relations, functions } = await fencepostOids(c);
  await c.query(`CREATE ${view} AS
    SELECT c.oid, c.relname AS name FROM pg_catalog.pg_class c WHERE c.oid IN (${relations.map((o) => `'${o}'::regclass`).join(', ')})
    UNION ALL
    SELECT p.oid, p.proname FROM pg_catalog.pg_proc p WHERE p.oid IN (${functions.map((o) => `'${o}'::regprocedure`).join(', ')})`);
  const name = view.split(/\s+/).at(-1)!;
  const { rows } = await c.query<{ n: number }>(
    `SELECT count(DISTINCT d.refobjid)::int AS n FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_rewrite r
        ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
      WHERE r.ev_class = $1::regclass AND d.refobjid = ANY ($2::oid[])`,
    [name, [...relations, ...functions]],
  );
  return { dependsOn: rows[0]!.n, of: relations.length + functions.length };
}

/** The relations `pids` hold a granted lock on among `oids` (prepared transactions: pid null), as `relation mode`. */
async function heldLocks(oids: string[], pids: number[] | 'prepared'): Promise<string[]> {
  const { rows } = await db.pool.query<{ held: string }>(
    `SELECT DISTINCT l.relation::regclass::text || ' ' || l.mode AS held FROM pg_locks l
      WHERE l.granted AND l.relation = ANY ($1::oid[]) AND ${pids === 'prepared' ? 'l.pid IS NULL' : 'l.pid = ANY ($2::int[])'}
      ORDER BY 1`,
    pids === 'prepared' ? [oids] : [oids, pids],
  );
  return rows.map((r) => r.held);
}

/**
 * The sequence-function trick: currval(), nextval() and setval() lock the relation they are given
 * (for the rest of the transaction, whatever rolls back) before they check it is a sequence the
 * caller may use. Each call in a savepoint rolled back; answers each call's error.
 */
async function sequenceTrick(c: pg.Client, oids: { serial: string; fences: string; registry: string }): Promise<string[]> {
  const calls = [
    `currval(${oids.serial}::regclass)`,
    `nextval(${oids.serial}::regclass)`,
    `setval(${oids.serial}::regclass, 1)`,
    `currval(${oids.fences}::regclass)`,
    `currval(${oids.registry}::regclass)`,
  ];
  const answers: string[] = [];
  await c.query('BEGIN');
  for (const call of calls) {
    await c.query('SAVEPOINT s');
    answers.push(await code(c.query(`SELECT ${call}`)));
    await c.query('ROLLBACK TO SAVEPOINT s');
  }
  return answers;
}
/** What sequenceTrick hears: no privilege on the sequence, and the tables are no sequences. */
const TRICK_REFUSED = ['42501', '42501', '42501', '42809', '42809'];
/** What sequenceTrick leaves locked: each relation it named. */
const TRICK_LOCKS = [
  'fencepost.fenced_backends RowExclusiveLock',
  'fencepost.fences RowExclusiveLock',
  'fencepost.session_serial RowExclusiveLock',
];

async function trickOids(c: pg.Client): Promise<{ serial: string; fences: string; registry: string }> {
  return {
    serial: await relationOid(c, 'session_serial'),
    fences: await relationOid(c, 'fences'),
    registry: await relationOid(c, 'fenced_backends'),
  };
}

// ---- the attacks ------------------------------------------------------------------------------------

describe("objects that depend on fencepost's objects", () => {
  const attackers = [
    { name: "tenant A's direct login", who: direct, schema: 'rp_direct', api: 'ok' },
    // No USAGE on fencepost_api: it names fencepost's objects by oid only.
    { name: 'a stranger with CONNECT only', who: stranger, schema: 'rp_stranger', api: '42501' },
  ];
  for (const attacker of attackers) {
    for (const door of DOORS) {
      test(`a TEMP view and a view in its own schema over fencepost's objects (${attacker.name}) do not pin B's raise through ${doorName(door)}`, async () => {
        // Invariant: the raise goes through (top of file) while views name every object of fencepost's.
        const leader = await pausedLeader(B, `${B.prefix}views-${attacker.schema}-${door}`);
        const c = await connectDirect(attacker.who);
        const temp = await pinByOid(c, 'TEMP VIEW rp_pins');
        expect(temp.dependsOn).toBe(temp.of);
        const owned = await pinByOid(c, `VIEW ${attacker.schema}.pins_${door}`);
        expect(owned.dependsOn).toBe(owned.of);
        // Views calling the functions its role may execute (a stranger may not even name them).
        expect(
          await code(
            c.query(
              `CREATE TEMP VIEW rp_calls AS SELECT fencepost_api.session_start() AS s, fencepost_api.fence_session(NULL, NULL, NULL) AS f`,
            ),
          ),
        ).toBe(attacker.api);
        expect(
          await code(c.query(`CREATE VIEW ${attacker.schema}.calls_${door} AS SELECT fencepost_api.fence_session('', '', 0) AS f`)),
        ).toBe(attacker.api);
        // Held open, reading its views.
        await c.query('BEGIN');
        await c.query('SELECT count(*) FROM rp_pins');
        expect(await raise(door, B, leader.fenceKey, leader.next)).toBe('ok');
        await expectRevoked(leader);
      });
    }
  }
});

describe('locks taken before privilege checks', () => {
  for (const door of DOORS) {
    test(`currval/nextval/setval on fencepost.session_serial's oid (and on its tables') in savepoints rolled back, held open by A's direct login, A's SQL session and a stranger, do not pin B's raise through ${doorName(door)}`, async () => {
      // Invariant: the raise goes through while each attacker holds RowExclusiveLock on fencepost's
      // sequence and tables (shown in pg_locks): the raise needs no lock that conflicts with it.
      const leader = await pausedLeader(B, `${B.prefix}sequence-${door}`);
      const attackers = [
        await connectDirect(direct),
        await connectFenced(A, `${A.prefix}sequence-${door}`, 1),
        await connectDirect(stranger),
      ];
      const oids = await trickOids(attackers[0]!);
      for (const c of attackers) expect(await sequenceTrick(c, oids)).toEqual(TRICK_REFUSED);
      for (const c of attackers) expect(await heldLocks(Object.values(oids), [await pidOf(c)])).toEqual(TRICK_LOCKS);
      expect(await raise(door, B, leader.fenceKey, leader.next)).toBe('ok');
      await expectRevoked(leader);
    });
  }

  for (const door of DOORS) {
    test(`the sequence-function locks kept by PREPARE TRANSACTION (A's direct login) do not pin B's raise through ${doorName(door)}`, async () => {
      // Invariant: the raise goes through while a prepared transaction, which no raise can end,
      // holds RowExclusiveLock on fencepost's sequence and tables.
      const leader = await pausedLeader(B, `${B.prefix}prepared-${door}`);
      const c = await connectDirect(direct);
      const oids = await trickOids(c);
      expect(await sequenceTrick(c, oids)).toEqual(TRICK_REFUSED);
      const maxPrepared = Number(
        (await db.pool.query<{ max_prepared_transactions: string }>('SHOW max_prepared_transactions')).rows[0]!.max_prepared_transactions,
      );
      const prepared = await code(c.query(`PREPARE TRANSACTION 'rp-${tag}-${door}'`));
      if (maxPrepared > 0) {
        expect(prepared).toBe('ok');
        expect(await heldLocks(Object.values(oids), 'prepared')).toEqual(TRICK_LOCKS);
      } else {
        // A cluster without prepared transactions (the test cluster has them: global-setup.ts):
        // PREPARE fails and rolls the transaction back; what is left to check is the raise.
        expect(prepared).toBe('55000');
      }
      expect(await raise(door, B, leader.fenceKey, leader.next)).toBe('ok');
      await expectRevoked(leader);
    });
  }

  for (const door of DOORS) {
    test(`LOCK TABLE and SELECT … FOR SHARE on fencepost's relations, B's protected table and pg_class are refused 42501 before they queue, and B's raise through ${doorName(door)} goes through`, async () => {
      // Invariant: each attempt is refused with 42501, not after a wait in the lock queue (55P03:
      // it would queue behind the attacker's own locks of the sequence trick and pg_class); then the
      // raise goes through.
      const leader = await pausedLeader(B, `${B.prefix}lock-table-${door}`);
      const holder = await connectDirect(direct);
      const oids = await trickOids(holder);
      expect(await sequenceTrick(holder, oids)).toEqual(TRICK_REFUSED);
      await holder.query('LOCK TABLE pg_catalog.pg_class IN ACCESS SHARE MODE'); // SELECT on pg_class is everyone's
      const attempts = [
        'LOCK TABLE fencepost.fences IN ACCESS EXCLUSIVE MODE',
        'LOCK TABLE fencepost.fenced_backends IN SHARE MODE',
        'LOCK TABLE fencepost.session_serial IN ACCESS EXCLUSIVE MODE',
        'SELECT highest_token FROM fencepost.fences FOR SHARE',
        `SELECT highest_token FROM fencepost.fences WHERE fence_key = '${leader.fenceKey}' FOR KEY SHARE`,
        `LOCK TABLE ${B.table} IN ACCESS EXCLUSIVE MODE`,
        `SELECT * FROM ${B.table} FOR SHARE`,
        'LOCK TABLE pg_catalog.pg_class IN ACCESS EXCLUSIVE MODE',
        'SELECT relname FROM pg_catalog.pg_class FOR SHARE',
      ];
      const attackers = [
        await connectDirect(direct),
        await connectFenced(A, `${A.prefix}lock-table-${door}`, 1),
        await connectDirect(stranger),
      ];
      for (const c of attackers) {
        await c.query(`SET lock_timeout = 2000`);
        await c.query('BEGIN');
        for (const attempt of attempts) {
          await c.query('SAVEPOINT s');
          expect(await code(c.query(attempt)), attempt).toBe('42501');
          await c.query('ROLLBACK TO SAVEPOINT s');
        }
      }
      expect(await raise(door, B, leader.fenceKey, leader.next)).toBe('ok');
      await expectRevoked(leader);
    });
  }

  for (const door of DOORS) {
    test(`advisory locks on fencepost's own keys and on B's fence key, by session and by transaction, do not pin B's raise through ${doorName(door)}`, async () => {
      // Invariant: the raise goes through while A's direct login holds fencepost's own advisory
      // locks (migrations, client-login provisioning) and those it can derive from B's fence key,
      // for its session and in an open transaction, and a stranger holds others shared.
      const leader = await pausedLeader(B, `${B.prefix}advisory-${door}`);
      const own = [String(migrationLock().values![0]), PROVISIONING_LOCK_KEY.toString()];
      const holder = await connectDirect(direct);
      await holder.query('SELECT pg_advisory_lock($1::bigint), pg_advisory_lock($2::bigint)', own);
      await holder.query('SELECT pg_advisory_lock(hashtext($1)), pg_advisory_lock(hashtextextended($1, 0)), pg_advisory_lock(0, 0)', [
        leader.fenceKey,
      ]);
      await holder.query('BEGIN');
      await holder.query('SELECT pg_advisory_xact_lock(hashtext($1) + 1), pg_advisory_xact_lock(0)', [leader.fenceKey]);
      const sharer = await connectDirect(stranger);
      await sharer.query('BEGIN');
      await sharer.query('SELECT pg_advisory_xact_lock_shared(hashtext($1) - 1), pg_advisory_xact_lock_shared(1, 1)', [leader.fenceKey]);
      expect(await raise(door, B, leader.fenceKey, leader.next)).toBe('ok');
      await expectRevoked(leader);
    });
  }

  // Not tested here, because it holds for nothing in the database: a role that can connect can
  // queue an AccessExclusiveLock request on a catalog (CREATE RULE … ON pg_catalog.pg_class waits
  // for the lock before its privilege check) behind a share lock of its own, and every later
  // catalog lookup, new backends' logins included, waits behind it. docs/security.md lists it.
});

describe('a session that switched keys', () => {
  for (const door of DOORS) {
    test(`a session fenced at A that SETs B's fencepost.fence_key and token writes neither B's protected table (FP403) nor A's (FP400), and A's raise through ${doorName(door)} ends it`, async () => {
      // Invariants: no row lands in either table from the switched session; A's raise goes through
      // and ends it; B's own leader, fenced at B's key, is left alone by A's raise.
      const highest = async (fenceKey: string) => Number((await fenceRow(db.pool, fenceKey))?.highest_token ?? 0);
      const bToken = (await highest(B.fenceKey)) + 1;
      const bLeader = await connectFenced(B, B.fenceKey, bToken);
      const aToken = (await highest(A.fenceKey)) + 1;
      const switched = await connectFenced(A, A.fenceKey, aToken);
      await switched.query(`INSERT INTO ${A.table} (v) VALUES ('before the switch')`); // it passed A's fence
      const older = await registeredBelow(A.fenceKey, aToken + 1);
      expect(older).toEqual([{ pid: await pidOf(switched), started: expect.any(String) }]);
      const rows = async () =>
        (await db.pool.query<{ n: number }>(`SELECT (SELECT count(*) FROM ${A.table}) + (SELECT count(*) FROM ${SHARED_B}) AS n`)).rows[0]!
          .n;
      const before = await rows();
      await switched.query(`SET fencepost.fence_key = '${B.fenceKey}'`);
      await switched.query(`SET fencepost.token = '${bToken}'`);
      expect(await code(switched.query(`INSERT INTO ${SHARED_B} (v) VALUES ('switched to B')`))).toBe('FP403');
      expect(await code(switched.query(`INSERT INTO ${B.table} (v) VALUES ('switched to B')`))).toBe('42501'); // B's schema is B's alone
      expect(await code(switched.query(`INSERT INTO ${A.table} (v) VALUES ('switched from A')`))).toBe('FP400');
      expect(await rows()).toBe(before);
      expect(await raise(door, A, A.fenceKey, aToken + 1)).toBe('ok');
      await expectRevoked({ client: switched, fenceKey: A.fenceKey, next: aToken + 1, older });
      expect(await code(bLeader.query(`INSERT INTO ${SHARED_B} (v) VALUES ('B still leads')`))).toBe('ok');
    });
  }
});

describe('a flood of raises', () => {
  /** Catalog rows of persistent relations (each session's temporary sequence comes and goes with it). */
  const catalogRows = async () =>
    (
      await db.pool.query<{ classes: number; attributes: number }>(
        `SELECT (SELECT count(*) FROM pg_class WHERE relpersistence <> 't')::int AS classes,
                (SELECT count(*) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid WHERE c.relpersistence <> 't')::int AS attributes`,
      )
    ).rows[0]!;

  for (const door of DOORS) {
    test(`100 raises of one of A's fence keys, on both doors, grow no catalog and do not pin B's raise through ${doorName(door)}`, async () => {
      // Invariants: pg_class and pg_attribute hold as many rows after the flood as before; B's raise
      // during the flood goes through; every raise of the flood goes through.
      const FLOOD = 100;
      const floodKey = `${A.prefix}flood-${door}`;
      const before = await catalogRows();
      const leader = await pausedLeader(B, `${B.prefix}flood-${door}`);
      let raised = 0;
      const refused: string[] = [];
      const flood = (async () => {
        for (let token = 1; token <= FLOOD; token++) {
          const answer = await raise(token % 2 === 0 ? 'sql' : 'http', A, floodKey, token);
          if (answer !== 'ok') refused.push(`${token}: ${answer}`);
          raised = token;
        }
      })();
      await expect.poll(() => raised).toBeGreaterThanOrEqual(10);
      const answer = await raise(door, B, leader.fenceKey, leader.next);
      await flood;
      expect(answer).toBe('ok');
      await expectRevoked(leader);
      expect(refused).toEqual([]);
      expect(await fenceRow(db.pool, floodKey)).toEqual({ highest_token: String(FLOOD) });
      await Promise.all(opened.splice(0).map((c) => c.end().catch(() => {})));
      expect(await catalogRows()).toEqual(before);
    });
  }
});
