// The token forgery guard on the SQL endpoint, against a real ZooKeeper and real elections (with
// digest credentials, ZK_AUTH). A connection is fenced once, at startup: a real leader's first
// connection raises its fence; a connection whose forged token would raise a guarded fence is
// refused at startup (FATAL FP409 "unverified fencing token", FP503 while ZooKeeper cannot be
// asked), nothing raised; tokens at or below the fence's highest are decided without asking
// ZooKeeper. A token SET after startup raises nothing: the connection stays fenced at its startup
// pair, and its protected tables refuse its writes (FP400).
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest';
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { Election } from '../../../src/election/election.ts';
import { ZkSession } from '../../../src/election/zk-session.ts';
import type { DigestAuth } from '../../../src/election/acl.ts';
import { LocalZooKeeper } from '../../../src/demo/local-zookeeper.ts';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';
import { protectTable } from '../../../src/fence/protect.ts';

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
  // A table the fence of orders/1 protects.
  await db.pool.query('CREATE TABLE public.orders_1 (id int PRIMARY KEY)');
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON public.orders_1 TO ${clientRoleFor(db.url)}`);
  await protectTable(db.pool, 'public.orders_1', 'orders/1');
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
const exists = async (n: number, table = 'items') =>
  (await db.pool.query(`SELECT 1 FROM public.${table} WHERE id = $1`, [n])).rowCount === 1;
const failure = (p: Promise<unknown>) =>
  p.then(
    () => ({ code: 'ok', message: '', detail: '' }),
    (e: { code?: string; message?: string; detail?: string }) => ({
      code: e.code ?? String(e),
      message: e.message ?? '',
      detail: e.detail ?? '',
    }),
  );
const guard = () => sql.proxy.app.forgeryGuard!;

describe('forgery guard on the SQL endpoint', () => {
  let a: Election;
  let tokenA: bigint;

  test("the real leader's first connection raises its fence (verified in ZooKeeper); its later connections do not ask ZooKeeper", async () => {
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
    // Another connection of the leader: at the fence's highest token, nothing to verify.
    const other = await session('leader-a-2', tokenA, 'orders/1');
    const y = id();
    await other.query(`INSERT INTO orders_1 VALUES (${y})`);
    expect(await exists(y, 'orders_1')).toBe(true);
    expect(guard().zkReads).toBe(reads);
  });

  test('a forged token in the startup options is refused at connect with FP409 "unverified fencing token"; the fence is not raised', async () => {
    const forged = 2n ** 31n - 2n;
    await expect(session('forger', forged, 'orders/1')).rejects.toMatchObject({
      code: 'FP409',
      message: `unverified fencing token: token ${forged} would raise fence key "orders/1" but is not the current leader's`,
      detail: `unverified token: fence key "orders/1", token ${forged}, highest token ${tokenA}`,
    });
    expect(await fenceRow(db.pool, 'orders/1')).toEqual({ highest_token: tokenA.toString() });
    // A fresh guarded fence cannot be claimed either; a huge token is refused without asking ZooKeeper.
    const reads = guard().zkReads;
    await expect(session('forger-2', 9223372036854775807n, 'orders/fresh')).rejects.toMatchObject({ code: 'FP409' });
    expect(guard().zkReads).toBe(reads);
    expect(await fenceRow(db.pool, 'orders/fresh')).toBeUndefined();
  });

  test("a forged token SET after startup, by SET or by a set_config, raises nothing: the protected table refuses the connection's writes (FP400), the fence stays at the leader's token", async () => {
    const c = await session('leader-turned-forger', tokenA, 'orders/1');
    const reads = guard().zkReads;
    const before = id();
    await c.query(`INSERT INTO orders_1 VALUES (${before})`);
    await c.query(`SET fencepost.token = '${tokenA + 1000n}'`);
    const x = id();
    expect((await failure(c.query(`INSERT INTO orders_1 VALUES (${x})`))).code).toBe('FP400');
    // Postgres checks the settings themselves, however they were set.
    const d = await session('hidden-forger', tokenA, 'orders/1');
    await d.query(`SELECT pg_catalog.set_config('fence' || 'post.token', '${tokenA + 2000n}', false)`);
    const y = id();
    expect((await failure(d.query(`INSERT INTO orders_1 VALUES (${y})`))).code).toBe('FP400');
    expect([await exists(before, 'orders_1'), await exists(x, 'orders_1'), await exists(y, 'orders_1')]).toEqual([true, false, false]);
    expect(await fenceRow(db.pool, 'orders/1')).toEqual({ highest_token: tokenA.toString() });
    expect(guard().zkReads).toBe(reads);
  });

  test("a new leader's first connection raises the fence; it ends the old leader's connection (FP409), whose reconnect is refused as stale; unguarded keys are not checked", async () => {
    const old = await session('old-leader', tokenA, 'orders/2');
    await old.query(`INSERT INTO items VALUES (${id()}, 'old leader')`);
    // The raise ends the old connection: whether it hears so at once (an 'error' event) or at its
    // next query, what it hears is FP409.
    const ended = new Promise<unknown>((resolve) => old.once('error', resolve));
    await a.close();
    const b = await candidate('b');
    const tokenB = await b.waitForLeadership();
    expect(tokenB).toBeGreaterThan(tokenA);
    const c = await session('new-leader', tokenB, 'orders/2');
    await c.query(`INSERT INTO items VALUES (${id()}, 'new leader')`);
    expect(await fenceRow(db.pool, 'orders/2')).toEqual({ highest_token: tokenB.toString() });
    const zombie = id();
    const answer = await Promise.race([
      ended,
      old.query(`INSERT INTO items VALUES (${zombie}, 'zombie')`).then(
        () => 'written',
        (e: unknown) => e,
      ),
    ]);
    expect(answer).toMatchObject({ code: 'FP409', detail: `fence key "orders/2", token ${tokenA}, highest token ${tokenB}` });
    await expect(session('old-leader-again', tokenA, 'orders/2')).rejects.toMatchObject({
      code: 'FP409',
      message: `stale fencing token: token ${tokenA} is below the highest token ${tokenB} of fence key "orders/2"`,
    });
    expect(await exists(zombie)).toBe(false);
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

  test('a connection that would raise is refused FP503 at startup (safe to retry), nothing raised; one at the highest token connects and writes; a retry once ZooKeeper is back gets a verdict', async () => {
    await zk.stopNode(zk.nodes[0]!.id);
    await expect(down.connect('raiser', { options: fenceOptions(51, 'zk-down/1') })).rejects.toMatchObject({
      code: 'FP503',
      message: 'cannot verify fencing token 51 of fence key "zk-down/1": ZooKeeper unreachable',
    });
    expect(await fenceRow(db.pool, 'zk-down/1')).toEqual({ highest_token: '50' });
    // At the fence's own token nothing is raised, so nothing needs ZooKeeper.
    const holder = await down.connect('holder', { options: fenceOptions(50, 'zk-down/1') });
    clients.push(holder);
    const y = id();
    await holder.query(`INSERT INTO items VALUES (${y}, 'at the highest token')`);
    expect(await exists(y)).toBe(true);
    // ZooKeeper back: a new connection is asked about again and gets a verdict (51 is no leader's token).
    await zk.startNode(zk.nodes[0]!.id);
    await expect(down.connect('raiser', { options: fenceOptions(51, 'zk-down/1') })).rejects.toMatchObject({
      code: 'FP409',
      detail: expect.stringMatching(/^unverified token: /),
    });
    expect(await fenceRow(db.pool, 'zk-down/1')).toEqual({ highest_token: '50' });
  }, 60_000);
});
