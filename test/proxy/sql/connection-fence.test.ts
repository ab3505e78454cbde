// The SQL endpoint fences a connection once, at startup, and the database decides from then on:
// what a session does to its fencepost settings or its sequences afterwards cannot widen what it
// may write, and a raise leaves no connection of an older token alive. Invariant of every test:
// a protected table gets rows only from a connection fenced at the fence's current token for its
// fence key, checked in Postgres; the registry of fenced connections holds no row of a backend
// that a raise ended.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, type SqlProxy } from '../../support/sql.ts';
import { protectTable } from '../../../src/fence/protect.ts';
import { message } from '../../../src/proxy/sql/wire/framing.ts';
import { B, D, E, P, Q, RawClient } from './raw-client.ts';

const KEY = 'cf/orders';

let db: TestDatabase;
let sql: SqlProxy;
let next = 0;
const id = () => ++next;

beforeAll(async () => {
  db = await createTestDatabase();
  sql = await startSqlProxy(db);
  const role = clientRoleFor(db.url);
  await db.pool.query(
    'CREATE TABLE public.cf_guarded (id int PRIMARY KEY, v text); CREATE TABLE public.cf_plain (id int PRIMARY KEY, v text)',
  );
  await db.pool.query(`GRANT SELECT, INSERT ON public.cf_guarded, public.cf_plain TO ${role}`);
  await protectTable(db.pool, 'public.cf_guarded', KEY);
});
afterAll(async () => {
  await sql?.close();
  await db?.drop();
});

const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );
const rows = async (table: string, ids: number[]) =>
  (await db.pool.query<{ id: number }>(`SELECT id FROM public.${table} WHERE id = ANY($1::int[]) ORDER BY id`, [ids])).rows.map(
    (r) => r.id,
  );
const registered = async (pid: number) =>
  (await db.pool.query<{ token: string }>('SELECT token::text FROM fencepost.fenced_backends WHERE pid = $1', [pid])).rows.map(
    (r) => r.token,
  );
const backendPid = async (c: pg.Client) => (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;

describe('a connection is fenced once, at startup', () => {
  test('SET fencepost.token after startup does not re-fence: protected writes are refused (FP400) until RESET, a new connection at the new token writes', async () => {
    const c = await sql.connect('cf-set', { options: fenceOptions(3, KEY) });
    const a = id();
    await c.query(`INSERT INTO cf_guarded VALUES (${a}, 'at 3')`);
    await c.query(`SET fencepost.token = '4'`);
    expect((await c.query<Record<string, string>>('SHOW fencepost.token')).rows[0]!['fencepost.token']).toBe('4'); // Postgres's answer, as sent
    const b = id();
    const refused = await c.query(`INSERT INTO cf_guarded VALUES (${b}, 'after SET')`).catch((e: pg.DatabaseError) => e);
    expect(refused).toMatchObject({ code: 'FP400' });
    expect((refused as Error).message).toMatch(/changed after this connection was fenced/);
    // Unprotected tables: the connection writes as what it was fenced at (token 3), nothing more.
    const p = id();
    await c.query(`INSERT INTO cf_plain VALUES (${p}, 'plain')`);
    await c.query('RESET fencepost.token');
    const r = id();
    await c.query(`INSERT INTO cf_guarded VALUES (${r}, 'after RESET')`);
    // The fence never moved for a SET: token 4 is a new leader only once it connects with it.
    expect((await db.pool.query('SELECT highest_token::text AS h FROM fencepost.fences WHERE fence_key = $1', [KEY])).rows[0].h).toBe('3');
    const pid = await backendPid(c);
    const leader = await sql.connect('cf-set-new', { options: fenceOptions(4, KEY) });
    const l = id();
    await leader.query(`INSERT INTO cf_guarded VALUES (${l}, 'at 4')`);
    expect(await code(c.query(`INSERT INTO cf_guarded VALUES (${id()}, 'stale')`))).toBe('FP409');
    expect(await registered(pid)).toEqual([]);
    expect(await rows('cf_guarded', [a, b, r, l])).toEqual([a, r, l]);
    expect(await rows('cf_plain', [p])).toEqual([p]);
    await leader.end();
    await c.end().catch(() => {});
  });

  test('a session without a token that lifts the read-only default still cannot write a protected table (FP403)', async () => {
    const c = await sql.connect('cf-tokenless');
    expect(await code(c.query(`INSERT INTO cf_plain VALUES (${id()}, 'read-only default')`))).toBe('25006');
    await c.query('SET default_transaction_read_only = off');
    const g = id();
    expect(await code(c.query(`INSERT INTO cf_guarded VALUES (${g}, 'tokenless')`))).toBe('FP403');
    // Nor by naming a token now: the connection was not fenced at startup.
    await c.query(`SET fencepost.token = '99'; SET fencepost.fence_key = '${KEY}'`);
    expect(await code(c.query(`INSERT INTO cf_guarded VALUES (${g}, 'tokenless with SET')`))).toBe('FP403');
    expect(await code(c.query(`DO $$ BEGIN INSERT INTO public.cf_guarded VALUES (${g}, 'in a DO block'); END $$`))).toBe('FP403');
    expect(await rows('cf_guarded', [g])).toEqual([]);
    await c.end();
  });

  test('DISCARD ALL ends the connection fence: protected writes are refused; a new connection writes', async () => {
    const c = await sql.connect('cf-discard', { options: fenceOptions(4, KEY) });
    await c.query('DISCARD ALL');
    const d = id();
    expect(['55000', 'FP403', '42P01']).toContain(await code(c.query(`INSERT INTO cf_guarded VALUES (${d}, 'after DISCARD')`)));
    await c.end();
    const again = await sql.connect('cf-discard-2', { options: fenceOptions(4, KEY) });
    const e = id();
    await again.query(`INSERT INTO cf_guarded VALUES (${e}, 'reconnected')`);
    expect(await rows('cf_guarded', [d, e])).toEqual([e]);
    await again.end();
  });

  test('a protected write cannot be prepared (0A000), its first or a later one: nothing is left to commit after a raise', async () => {
    const c = await sql.connect('cf-prepare', { options: fenceOptions(4, KEY) });
    // A connect makes no temporary object: the first protected write makes the one that refuses PREPARE.
    const temp = async () =>
      (await c.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_class WHERE relnamespace = pg_my_temp_schema()')).rows[0]!.n;
    expect(await temp()).toBe(0);
    for (const [attempt, gid] of [
      [1, 'cf_x'],
      [2, 'cf_y'],
    ] as const) {
      const x = id();
      await c.query('BEGIN');
      await c.query(`INSERT INTO cf_guarded VALUES (${x}, 'to prepare')`);
      expect(await code(c.query(`PREPARE TRANSACTION '${gid}'`)), `attempt ${attempt}`).toBe('0A000');
      await c.query('ROLLBACK').catch(() => {});
      expect((await db.pool.query(`SELECT 1 FROM pg_prepared_xacts WHERE gid = $1`, [gid])).rowCount).toBe(0);
      expect(await rows('cf_guarded', [x])).toEqual([]);
    }
    // A committed protected write keeps the sequence; the next transaction reads it again.
    await c.query(`INSERT INTO cf_guarded VALUES (${id()}, 'kept')`);
    expect(await temp()).toBe(1);
    await c.query('BEGIN');
    await c.query(`INSERT INTO cf_guarded VALUES (${id()}, 'to prepare')`);
    expect(await code(c.query(`PREPARE TRANSACTION 'cf_z'`))).toBe('0A000');
    await c.query('ROLLBACK').catch(() => {});
    await c.end();
  });
});

describe('a raise revokes the older connections of its fence key', () => {
  test('many connections at the old token, idle and mid-transaction, are all ended by one raise; none of their open writes lands, the registry keeps none of them', async () => {
    const SESSIONS = 12;
    const old = await Promise.all(
      Array.from({ length: SESSIONS }, (_, i) => sql.connect(`cf-old-${i}`, { options: fenceOptions(10, 'cf/many') })),
    );
    const pids = await Promise.all(old.map(backendPid));
    const open: number[] = [];
    // Half of them hold an open transaction with a row written; the other half are idle.
    for (const c of old.slice(0, SESSIONS / 2)) {
      const n = id();
      open.push(n);
      await c.query('BEGIN');
      await c.query(`INSERT INTO cf_plain VALUES (${n}, 'open at 10')`);
    }
    for (const pid of pids) expect(await registered(pid)).toEqual(['10']);
    const leader = await sql.connect('cf-new', { options: fenceOptions(11, 'cf/many') });
    // Once the new leader is connected, no backend fenced at 10 is alive.
    const alive = await db.pool.query('SELECT pid FROM pg_stat_activity WHERE pid = ANY($1::int[])', [pids]);
    expect(alive.rows).toEqual([]);
    for (const pid of pids) expect(await registered(pid)).toEqual([]);
    const answers = await Promise.all(old.map((c) => code(c.query('COMMIT'))));
    expect(new Set(answers)).toEqual(new Set(['FP409']));
    expect(await rows('cf_plain', open)).toEqual([]);
    await leader.end();
    await Promise.all(old.map((c) => c.end().catch(() => {})));
  });
});

// A writer that sent Flush instead of Sync waits for answers with nothing more to say (postgres.js
// sends Parse/Describe/Flush before its first Bind): when a raise ends its backend, its answer is
// FP409 at once, not at its next message.
describe('a raise reaches a writer waiting on a Flush', () => {
  const H = () => message('H');

  test('an Execute awaited with Flush, no Sync: FP409 and the session closes', { timeout: 30_000 }, async () => {
    const raw = await RawClient.connect(sql.port, sql.database, 'cf-flush-exec', fenceOptions(1, 'cf/flush-exec'));
    raw.write(P('SELECT pg_sleep(60)'), B(), E(), H());
    const leader = await sql.connect('cf-flush-exec-new', { options: fenceOptions(2, 'cf/flush-exec') });
    const answer = await raw.read(1);
    expect(answer.errors).toEqual(['FP409']);
    expect((await raw.read(1)).closed).toBe(true);
    await leader.end();
  });

  test('after a COPY FROM STDIN, an idle writer hears nothing until it speaks; then FP409', { timeout: 30_000 }, async () => {
    const raw = await RawClient.connect(sql.port, sql.database, 'cf-copy-idle', fenceOptions(1, 'cf/copy-idle'));
    const n = id();
    const copied = await raw.send([Q('COPY cf_plain (id, v) FROM STDIN'), message('d', Buffer.from(`${n}\tcopied\n`)), message('c')]);
    expect(copied.tags).toEqual(['COPY 1']);
    const leader = await sql.connect('cf-copy-idle-new', { options: fenceOptions(2, 'cf/copy-idle') });
    // The raise committed (the leader is connected) and ended the backend; the proxy waits for the writer.
    await leader.query('SELECT 1');
    await new Promise((r) => setTimeout(r, 500));
    expect(raw.unread).toBe(0);
    expect((await raw.send([Q('SELECT 1')])).errors).toEqual(['FP409']);
    await leader.end();
  });

  test(
    'Parse and Describe answered after a Flush, then a raise: FP409 without waiting for the next message',
    { timeout: 30_000 },
    async () => {
      const raw = await RawClient.connect(sql.port, sql.database, 'cf-flush-describe', fenceOptions(1, 'cf/flush-describe'));
      raw.write(P('SELECT $1::int', 'stmt'), D('stmt'), H());
      const leader = await sql.connect('cf-flush-describe-new', { options: fenceOptions(2, 'cf/flush-describe') });
      const answer = await raw.read(1);
      expect(answer.frames.map((f) => f.type).join('')).toBe('1tTEZ');
      expect(answer.errors).toEqual(['FP409']);
      await leader.end();
    },
  );
});

// A terminated backend's session asks whether a raise ended it by waiting on the fence row, which a
// raise holds until it commits: the answer comes when the raise commits, or at once when none is in
// flight. Here the proxy's lock timeout (the most it would wait) is far beyond the test's own.
describe('why a backend went, with a lock timeout of 10 minutes', () => {
  let patient: SqlProxy;
  beforeAll(async () => {
    patient = await startSqlProxy(db, { FENCEPOST_LOCK_TIMEOUT_MS: '600000', FENCEPOST_STATEMENT_TIMEOUT_MS: '1200000' });
  });
  afterAll(async () => {
    await patient?.close();
  });

  test(
    "an operator's pg_terminate_backend reaches the writer as Postgres's 57P01, without waiting for a raise",
    { timeout: 30_000 },
    async () => {
      const c = await patient.connect('cf-operator', { options: fenceOptions(1, 'cf/operator') });
      c.on('error', () => {});
      const pid = await backendPid(c);
      const sleeping = code(c.query('SELECT pg_sleep(60)'));
      await db.pool.query('SELECT pg_terminate_backend($1)', [pid]);
      expect(await sleeping).toBe('57P01');
      await c.end().catch(() => {});
    },
  );

  test('a raise that ends a busy connection reaches its writer as FP409 once the raise commits', { timeout: 30_000 }, async () => {
    const c = await patient.connect('cf-busy', { options: fenceOptions(1, 'cf/busy') });
    c.on('error', () => {});
    const sleeping = code(c.query('SELECT pg_sleep(60)'));
    const leader = await patient.connect('cf-busy-new', { options: fenceOptions(2, 'cf/busy') });
    expect(await sleeping).toBe('FP409');
    await leader.end();
    await c.end().catch(() => {});
  });
});
