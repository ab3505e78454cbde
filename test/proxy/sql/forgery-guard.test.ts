// The token forgery guard on the SQL endpoint, against a real ZooKeeper and real elections (with
// digest credentials, ZK_AUTH): a real leader's SQL transactions raise its fence; a forged token
// that would raise a guarded fence fails its transaction (FP409 "unverified token"), nothing
// committed, however the session got the token (startup options, SET, or set_config the proxy
// cannot see); tokens at or below the fence's highest are answered without asking ZooKeeper.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest';
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { Election } from '../../../src/election/election.ts';
import { ZkSession } from '../../../src/election/zk-session.ts';
import type { DigestAuth } from '../../../src/election/acl.ts';
import { LocalZooKeeper } from '../../../src/demo/local-zookeeper.ts';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';

let db: TestDatabase;
let sql: SqlProxy;
const electionPath = `/fencepost-test/sql-guard-${randomUUID().slice(0, 8)}`;
const AUTH: DigestAuth = { user: 'elector', password: `pw-${randomUUID()}` };
const elections: Election[] = [];
const clients: pg.Client[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  const s = await ZkSession.open({ connect: inject('zkConnect'), sessionTimeoutMs: 4000 });
  await s.mkdirp('/fencepost-test');
  await s.close();
  sql = await startSqlProxy(db, {
    FENCEPOST_FORGERY_GUARD: JSON.stringify({ 'orders/': electionPath }),
    ZK_CONNECT: inject('zkConnect'),
    ZK_AUTH: `${AUTH.user}:${AUTH.password}`,
  });
  await db.pool.query('CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON public.items TO ${clientRoleFor(db.url)}`);
});
afterAll(async () => {
  await Promise.all(clients.map((c) => c.end().catch(() => {})));
  await Promise.all(elections.map((e) => e.close()));
  await sql?.close();
  await db?.drop();
});

async function candidate(id: string): Promise<Election> {
  const e = new Election({ connect: inject('zkConnect'), path: electionPath, id, sessionTimeoutMs: 4000, auth: AUTH });
  elections.push(e);
  await e.start();
  return e;
}

async function session(user: string, token: bigint | number, fenceKey: string): Promise<pg.Client> {
  const c = await sql.connect(user, { options: fenceOptions(token, fenceKey) });
  clients.push(c);
  return c;
}

let nextId = 1;
const id = () => nextId++;
const exists = async (n: number) => (await db.pool.query('SELECT 1 FROM public.items WHERE id = $1', [n])).rowCount === 1;
const failure = (p: Promise<unknown>) =>
  p.then(
    () => ({ code: 'ok', detail: '' }),
    (e: { code?: string; detail?: string }) => ({ code: e.code ?? String(e), detail: e.detail ?? '' }),
  );
const guard = () => sql.proxy.app.forgeryGuard!;

describe('forgery guard on the SQL endpoint', () => {
  let a: Election;
  let tokenA: bigint;

  test('the real leader raises its fence over SQL; its later transactions do not ask ZooKeeper', async () => {
    await (await candidate('gone')).close(); // an earlier leader: the real token is above zero
    a = await candidate('a');
    tokenA = await a.waitForLeadership();
    expect(tokenA).toBeGreaterThan(0n);
    const c = await session('leader-a', tokenA, 'orders/1');
    const x = id();
    await c.query(`INSERT INTO items VALUES (${x}, 'simple')`);
    expect(await exists(x)).toBe(true);
    expect(await fenceRow(db.pool, 'orders/1')).toEqual({ highest_token: tokenA.toString() });
    const reads = guard().zkReads;
    expect(reads).toBeGreaterThanOrEqual(1);
    for (let i = 0; i < 3; i++) await c.query('INSERT INTO items VALUES ($1, $2)', [id(), 'extended']);
    const other = await session('leader-a-2', tokenA, 'orders/1'); // another session of the leader: cached
    await other.query(`INSERT INTO items VALUES (${id()}, 'second session')`);
    expect(guard().zkReads).toBe(reads);
  });

  test('a forged token from the startup options fails its transaction with FP409 "unverified token", in either protocol, nothing committed', async () => {
    const forged = 2n ** 31n - 2n;
    const c = await session('forger', forged, 'orders/1');
    const x = id();
    const simple = await failure(c.query(`INSERT INTO items VALUES (${x}, 'forged')`));
    expect(simple.code).toBe('FP409');
    expect(simple.detail).toBe(`unverified token: fence key "orders/1", token ${forged}, highest token ${tokenA}`);
    expect((await failure(c.query('INSERT INTO items VALUES ($1, $2)', [x, 'forged']))).code).toBe('FP409');
    expect(await exists(x)).toBe(false);
    expect(await fenceRow(db.pool, 'orders/1')).toEqual({ highest_token: tokenA.toString() });
    // A fresh guarded fence cannot be claimed either; a huge token is refused without asking ZooKeeper.
    const reads = guard().zkReads;
    const fresh = await session('forger-2', 9223372036854775807n, 'orders/fresh');
    expect((await failure(fresh.query('SELECT 1'))).code).toBe('FP409');
    expect(guard().zkReads).toBe(reads);
    expect(await fenceRow(db.pool, 'orders/fresh')).toBeUndefined();
  });

  test('a forged token set by SET is refused; one set by a set_config the proxy cannot see changes nothing: the session writes as the pair it was fenced at', async () => {
    const c = await session('leader-turned-forger', tokenA, 'orders/1');
    await c.query(`INSERT INTO items VALUES (${id()}, 'as leader')`);
    await c.query(`SET fencepost.token = '${tokenA + 1000n}'`);
    const x = id();
    expect((await failure(c.query(`INSERT INTO items VALUES (${x}, 'after SET')`))).code).toBe('FP409');
    // The session is stuck with that token (its own SET back would run fenced by it): a new one.
    const d = await session('hidden-forger', tokenA, 'orders/1');
    await d.query(`INSERT INTO items VALUES (${id()}, 'leader again')`);
    // Text without the word: the proxy does not read the settings back. The session is fenced at
    // the pair it proved (rule.ts session fence), not at what its settings say: the forged token
    // raises nothing, and the write is the current leader's.
    await d.query(`SELECT pg_catalog.set_config('fence' || 'post.token', '${tokenA + 2000n}', false)`);
    const y = id();
    await d.query(`INSERT INTO items VALUES (${y}, 'hidden set_config')`);
    expect([await exists(x), await exists(y)]).toEqual([false, true]);
    expect(await fenceRow(db.pool, 'orders/1')).toEqual({ highest_token: tokenA.toString() });
  });

  test('a new leader raises with SET over SQL; the old leader is then stale (FP409 stale); unguarded keys are not checked', async () => {
    const old = await session('old-leader', tokenA, 'orders/2');
    await old.query(`INSERT INTO items VALUES (${id()}, 'old leader')`);
    await a.close();
    const b = await candidate('b');
    const tokenB = await b.waitForLeadership();
    expect(tokenB).toBeGreaterThan(tokenA);
    const c = await session('new-leader', tokenA, 'orders/2');
    await c.query(`SET fencepost.token = '${tokenB}'`);
    await c.query(`INSERT INTO items VALUES (${id()}, 'new leader')`);
    expect(await fenceRow(db.pool, 'orders/2')).toEqual({ highest_token: tokenB.toString() });
    const stale = await failure(old.query(`INSERT INTO items VALUES (${id()}, 'zombie')`));
    expect(stale.code).toBe('FP409');
    expect(stale.detail).toBe(`fence key "orders/2", token ${tokenA}, highest token ${tokenB}`);
    const free = await session('unguarded', 9223372036854775807n, 'free/1');
    await free.query(`INSERT INTO items VALUES (${id()}, 'unguarded')`);
    expect(await fenceRow(db.pool, 'free/1')).toEqual({ highest_token: '9223372036854775807' });
  });
});

// A ZooKeeper of its own, stopped mid-test: only the guard's ZooKeeper fails, nothing else.
describe('forgery guard on the SQL endpoint, its ZooKeeper down', () => {
  let zk: LocalZooKeeper;
  let down: SqlProxy;
  beforeAll(async () => {
    zk = await LocalZooKeeper.start({ servers: 1, tickTimeMs: 200 });
    down = await startSqlProxy(db, {
      FENCEPOST_FORGERY_GUARD: JSON.stringify({ 'zk-down/': '/fencepost-test/zk-down' }),
      ZK_CONNECT: zk.connectString,
      ZK_AUTH: `${AUTH.user}:${AUTH.password}`,
    });
    await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('zk-down/1', 50)`);
  });
  afterAll(async () => {
    await down?.close();
    await zk?.stop();
  });

  test('a raise gets FP503 (safe to retry), nothing committed; a transaction that cannot raise goes through; the retry asks again', async () => {
    await zk.stopNode(zk.nodes[0]!.id);
    const raiser = await down.connect('raiser', { options: fenceOptions(51, 'zk-down/1') });
    clients.push(raiser);
    const x = id();
    const unavailable = await failure(raiser.query(`INSERT INTO items VALUES (${x}, 'unverifiable raise')`));
    expect(unavailable.code).toBe('FP503');
    expect(await exists(x)).toBe(false);
    expect(await fenceRow(db.pool, 'zk-down/1')).toEqual({ highest_token: '50' });
    // At the fence's own token nothing is raised, so nothing needs ZooKeeper.
    const holder = await down.connect('holder', { options: fenceOptions(50, 'zk-down/1') });
    clients.push(holder);
    const y = id();
    await holder.query(`INSERT INTO items VALUES (${y}, 'at the highest token')`);
    expect(await exists(y)).toBe(true);
    // ZooKeeper back: the same transaction asks again and gets a verdict (51 is no leader's token).
    await zk.startNode(zk.nodes[0]!.id);
    const z = id();
    const verdict = await failure(raiser.query(`INSERT INTO items VALUES (${z}, 'retried')`));
    expect(verdict.code).toBe('FP409');
    expect(verdict.detail).toMatch(/^unverified token: /);
    expect(await exists(z)).toBe(false);
    expect(await fenceRow(db.pool, 'zk-down/1')).toEqual({ highest_token: '50' });
  }, 60_000);
});
