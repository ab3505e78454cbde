// An answer says what happened, with a real synchronous standby stalled (its WAL receiver stopped):
// every commit on the primary then waits in SyncRep. A write whose commit was sent and not
// confirmed — the pool's query timeout while the commit waits, a transaction's deadline ending
// its backend, a raise's COMMIT, a wait Postgres cancelled with a warning — answers 503
// `commit_unknown`, and once the standby resumes it is there: a `unavailable` ("safe to retry")
// would have lied. A write that failed before its commit answers `unavailable` and is never there.
import { afterAll, afterEach, beforeAll, expect, test } from 'vitest';
import {
  stallStandby,
  drainSyncRep,
  startSynchronousDatabase,
  syncRepWaiters,
  type ReplicatedPostgres,
  type StalledStandby,
} from '../support/replication.ts';
import { clientRoleFor, type TestDatabase } from '../support/db.ts';
import { startSqlProxy, type SqlProxy } from '../support/sql.ts';

let repl: ReplicatedPostgres;
let db: TestDatabase;
let proxy: SqlProxy;
let stalled: StalledStandby | null = null;

beforeAll(async () => {
  ({ repl, db } = await startSynchronousDatabase('fp_commit_unknown', 'fp_cu_http'));
  // Statements are cut server-side at 300 ms, and the pool stops waiting 5 s later: a commit
  // waiting for the standby is past any statement_timeout, so only that query timeout ends it.
  // A transaction's deadline is 3 s.
  proxy = await startSqlProxy(db, {
    FENCEPOST_STATEMENT_TIMEOUT_MS: '300',
    FENCEPOST_LOCK_TIMEOUT_MS: '100',
    FENCEPOST_TX_TIMEOUT_MS: '3000',
    FENCEPOST_RAISE_WAIT_MS: '0',
  });
  await db.pool.query(`GRANT SELECT, INSERT ON public.items TO ${clientRoleFor(db.url)}`);
}, 120_000);

/** Resumes the standby and waits until no commit waits for it. */
async function resume(): Promise<void> {
  stalled?.resume();
  stalled = null;
  await drainSyncRep(db.pool);
}

// Nothing left waiting for the standby: the next test counts its own waiters.
afterEach(resume);

afterAll(async () => {
  stalled?.resume();
  await proxy?.close();
  await db?.pool.end();
  await repl?.stop();
});

// Async, so each request is sent at once (an inject's request goes when it is awaited).
const put = async (key: string, token: number, fenceKey: string, body: string) =>
  await proxy.proxy.app.inject({
    method: 'PUT',
    url: `/v1/objects/${encodeURIComponent(key)}`,
    headers: { 'fencing-token': String(token), 'fence-key': fenceKey },
    payload: body,
  });

const transaction = async (fenceKey: string, token: number, statements: { sql: string; params?: unknown[] }[]) =>
  await proxy.proxy.app.inject({
    method: 'POST',
    url: '/v1/transactions',
    headers: { 'content-type': 'application/json' },
    payload: { fences: [{ key: fenceKey, token: String(token) }], statements },
  });

async function objectBody(key: string): Promise<string | null> {
  const { rows } = await db.pool.query<{ body: string }>(
    `SELECT convert_from(body, 'UTF8') AS body FROM fencepost.objects WHERE key = $1`,
    [key],
  );
  return rows[0]?.body ?? null;
}

async function highestToken(fenceKey: string): Promise<string | null> {
  const { rows } = await db.pool.query<{ h: string }>('SELECT highest_token::text AS h FROM fencepost.fences WHERE fence_key = $1', [
    fenceKey,
  ]);
  return rows[0]?.h ?? null;
}

async function itemIds(): Promise<number[]> {
  return (await db.pool.query<{ id: number }>('SELECT id FROM public.items ORDER BY id')).rows.map((r) => r.id);
}

/** Polls until `read` gives `want` (the stalled backends finish their commits once the standby flushes). */
async function eventually<T>(read: () => Promise<T>, want: T): Promise<void> {
  for (let i = 0; ; i++) {
    const got = await read();
    if (JSON.stringify(got) === JSON.stringify(want)) return;
    if (i > 400) expect(got).toEqual(want);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test('a PUT whose commit waits on the stalled synchronous standby past the query timeout answers 503 commit_unknown, and it commits when the standby resumes', async () => {
  expect((await put('sync/warm', 1, 'sync-a', 'warm')).statusCode).toBe(200);
  stalled = await stallStandby(repl);
  const answer = put('sync/1', 1, 'sync-a', 'maybe');
  await syncRepWaiters(db.url, 1); // the write is in its commit, waiting for the standby
  const res = await answer;
  expect(res.statusCode, res.body).toBe(503);
  expect(res.json()).toMatchObject({ error: 'commit_unknown', message: expect.stringContaining('read back before retrying') });
  expect(res.headers['retry-after']).toBeUndefined();
  await resume();
  await eventually(() => objectBody('sync/1'), 'maybe');
}, 30_000);

test('a raise that cannot get its fence row before the lock timeout answers 503 unavailable, and nothing of it lands when the standby resumes', async () => {
  expect((await put('sync/b0', 1, 'sync-b', 'warm')).statusCode).toBe(200);
  stalled = await stallStandby(repl);
  // Token 1's write holds the fence row (in share mode) while its commit waits for the standby.
  const holder = put('sync/b1', 1, 'sync-b', 'held');
  await syncRepWaiters(db.url, 1);
  const raise = await proxy.proxy.app.inject({ method: 'PUT', url: '/v1/fences/sync-b', headers: { 'fencing-token': '2' } });
  expect(raise.statusCode, raise.body).toBe(503);
  expect(raise.json()).toMatchObject({ error: 'unavailable', message: expect.stringContaining('safe to retry') });
  expect((await holder).json().error).toBe('commit_unknown');
  await resume();
  await eventually(() => objectBody('sync/b1'), 'held');
  expect(await highestToken('sync-b')).toBe('1');
}, 30_000);

test("a PUT whose wait for the standby is cancelled answers 503 commit_unknown with Postgres's warning, never 200: it is committed on the primary only", async () => {
  expect((await put('sync/c0', 1, 'sync-c', 'warm')).statusCode).toBe(200);
  stalled = await stallStandby(repl);
  const answer = put('sync/c1', 1, 'sync-c', 'local');
  const [pid] = await syncRepWaiters(db.url, 1);
  await db.pool.query('SELECT pg_cancel_backend($1)', [pid]);
  const res = await answer;
  expect(res.statusCode, res.body).toBe(503);
  expect(res.json()).toMatchObject({ error: 'commit_unknown', message: expect.stringContaining('synchronous standby may not have it') });
  // Committed locally, visible before the standby has it.
  expect(await objectBody('sync/c1')).toBe('local');
}, 30_000);

test('a DELETE and a PUT /v1/fences whose waits for the standby are cancelled answer 503 commit_unknown; both landed on the primary', async () => {
  expect((await put('sync/d1', 1, 'sync-d', 'doomed')).statusCode).toBe(200);
  stalled = await stallStandby(repl);
  const del = proxy.proxy.app
    .inject({ method: 'DELETE', url: '/v1/objects/sync%2Fd1', headers: { 'fencing-token': '1', 'fence-key': 'sync-d' } })
    .then((r) => r);
  const [deleter] = await syncRepWaiters(db.url, 1);
  await db.pool.query('SELECT pg_cancel_backend($1)', [deleter]);
  const deleted = await del;
  expect(deleted.statusCode, deleted.body).toBe(503);
  expect(deleted.json().error).toBe('commit_unknown');
  expect(await objectBody('sync/d1')).toBeNull();
  const raise = proxy.proxy.app.inject({ method: 'PUT', url: '/v1/fences/sync-d', headers: { 'fencing-token': '5' } }).then((r) => r);
  const [raiser] = await syncRepWaiters(db.url, 1);
  await db.pool.query('SELECT pg_cancel_backend($1)', [raiser]);
  const raised = await raise;
  expect(raised.statusCode, raised.body).toBe(503);
  expect(raised.json().error).toBe('commit_unknown');
  expect(await highestToken('sync-d')).toBe('5');
}, 30_000);

test('a transaction whose COMMIT waits on the stalled standby past its deadline answers 503 commit_unknown, and its row is there afterwards', async () => {
  expect((await transaction('sync-t', 1, [{ sql: 'INSERT INTO public.items VALUES (1, $1)', params: ['warm'] }])).statusCode).toBe(200);
  stalled = await stallStandby(repl);
  const answer = transaction('sync-t', 1, [{ sql: 'INSERT INTO public.items VALUES (2, $1)', params: ['maybe'] }]);
  await syncRepWaiters(db.url, 1);
  const res = await answer;
  expect(res.statusCode, res.body).toBe(503);
  expect(res.json()).toMatchObject({ error: 'commit_unknown', message: expect.stringContaining('read back before retrying') });
  await resume();
  await eventually(itemIds, [1, 2]);
}, 30_000);

test("a transaction whose fence raise's COMMIT goes unanswered answers 503 commit_unknown: the fence is raised afterwards, its statements never ran", async () => {
  stalled = await stallStandby(repl);
  const answer = transaction('sync-r', 1, [{ sql: 'INSERT INTO public.items VALUES (10, $1)', params: ['never'] }]);
  await syncRepWaiters(db.url, 1); // the raise, in its COMMIT
  const res = await answer;
  expect(res.statusCode, res.body).toBe(503);
  expect(res.json()).toMatchObject({ error: 'commit_unknown', message: expect.stringContaining('none of the statements ran') });
  await resume();
  await eventually(() => highestToken('sync-r'), '1');
  expect(await itemIds()).not.toContain(10);
}, 30_000);

test('a transaction whose connection is lost before COMMIT answers 503 unavailable, and its row never lands', async () => {
  expect((await transaction('sync-l', 1, [{ sql: 'SELECT 1' }])).statusCode).toBe(200);
  stalled = await stallStandby(repl);
  const res = await transaction('sync-l', 1, [
    { sql: 'INSERT INTO public.items VALUES (20, $1)', params: ['never'] },
    { sql: 'SELECT pg_terminate_backend(pg_backend_pid())' },
  ]);
  expect(res.statusCode, res.body).toBe(503);
  expect(res.json()).toMatchObject({ error: 'unavailable', message: expect.stringContaining('safe to retry') });
  await resume();
  expect(await itemIds()).not.toContain(20);
}, 30_000);
