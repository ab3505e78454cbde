// The token forgery guard against a real ZooKeeper and real elections: a real leader raises its
// fence, a forged token cannot, and nothing a forger sends locks the real leader out. Elections run
// with digest credentials (ZK_AUTH); a second ZooKeeper client without them tries to plant and delete.
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { inject } from 'vitest';
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import zookeeper from 'node-zookeeper-client';
import { Election } from '../../src/election/election.ts';
import { ZkSession } from '../../src/election/zk-session.ts';
import { ZK_CODES, ZkError } from '../../src/election/errors.ts';
import { digestId, electionAcl, type DigestAuth } from '../../src/election/acl.ts';
import { buildApp } from '../../src/proxy/http/app.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { closedPort } from '../../tools/ports.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { protectPrefix } from '../../src/fence/protect.ts';

let db: TestDatabase;
let app: FastifyInstance;
const electionPath = `/fencepost-test/guard-${randomUUID().slice(0, 8)}`;
/** Paths a forger controls, each with a planted candidate of sequence 1 (see 'the guard trusts…'). */
const forged = { open: `${electionPath}-open`, otherPassword: `${electionPath}-other`, relocked: `${electionPath}-relocked` };
const AUTH: DigestAuth = { user: 'elector', password: `pw-${randomUUID()}` };
const elections: Election[] = [];
const sessions: ZkSession[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  app = buildApp({
    store: new FenceStore(db.pool, STORE_DEFAULTS),
    bodyLimitBytes: 1024,
    forgeryGuard: {
      zkConnect: inject('zkConnect'),
      electionAuth: AUTH,
      mappings: [
        { prefix: 'orders/', electionPath },
        { prefix: 'orders/audit/', electionPath: `${electionPath}-audit` },
        { prefix: 'planted/open/', electionPath: forged.open },
        { prefix: 'planted/other/', electionPath: forged.otherPassword },
        { prefix: 'planted/relocked/', electionPath: forged.relocked },
      ],
    },
  });
  await app.ready();
  // The common parent stays open: elections with credentials give the parents they create their ACL.
  await (await zk()).mkdirp('/fencepost-test');
});
afterAll(async () => {
  await Promise.all(elections.map((e) => e.close()));
  await Promise.all(sessions.map((s) => s.close()));
  await app.close();
  await db.drop();
});

async function zk(auth?: DigestAuth): Promise<ZkSession> {
  const s = await ZkSession.open({ connect: inject('zkConnect'), sessionTimeoutMs: 4000, ...(auth ? { auth } : {}) });
  sessions.push(s);
  return s;
}

async function zkRefusal(p: Promise<unknown>): Promise<number | 'accepted'> {
  try {
    await p;
    return 'accepted';
  } catch (err) {
    if (err instanceof ZkError) return err.code;
    throw err;
  }
}

/** A node named like a candidate with sequence 1, as a forger would plant it (not sequential: its name is chosen). */
const plantedName = () => `c_${randomUUID()}_1-0000000001`;

async function candidate(id: string): Promise<Election> {
  const e = new Election({ connect: inject('zkConnect'), path: electionPath, id, sessionTimeoutMs: 4000, auth: AUTH });
  elections.push(e);
  await e.start();
  return e;
}

const put = (fenceKey: string, token: bigint | string) =>
  app.inject({
    method: 'PUT',
    url: `/v1/objects/${encodeURIComponent(fenceKey)}`,
    headers: { 'fencing-token': token.toString() },
    payload: 'v',
  });
const highest = async (fenceKey: string) =>
  (await db.pool.query('SELECT highest_token FROM fencepost.fences WHERE fence_key = $1', [fenceKey])).rows[0]?.highest_token ?? null;

describe('forgery guard with a real election', () => {
  let a: Election;
  let b: Election;
  let tokenA: bigint;

  test('the real leader raises its fence; its later writes do not touch ZooKeeper', async () => {
    // An earlier leader came and went, so the real leader's token is above zero.
    await (await candidate('gone')).close();
    a = await candidate('a');
    tokenA = await a.waitForLeadership();
    expect(tokenA).toBeGreaterThan(0n);
    const res = await put('orders/1', tokenA);
    expect(res.statusCode, res.body).toBe(200);
    const reads = app.forgeryGuard!.zkReads;
    expect(reads).toBeGreaterThanOrEqual(1);
    for (let i = 0; i < 5; i++) expect((await put('orders/1', tokenA)).statusCode).toBe(200);
    expect(app.forgeryGuard!.zkReads).toBe(reads);
  });

  test('a forged huge token is refused without asking ZooKeeper and leaves the fence where it was', async () => {
    const reads = app.forgeryGuard!.zkReads;
    const res = await put('orders/1', 9223372036854775807n);
    expect(res.statusCode).toBe(409);
    expect(res.json()).toMatchObject({ error: 'unverified_token', fenceKey: 'orders/1', token: '9223372036854775807', electionPath });
    expect(app.forgeryGuard!.zkReads).toBe(reads);
    expect(await highest('orders/1')).toBe(tokenA.toString());
    // On a fence nobody has used yet, too: a forger cannot claim a fresh fence key either.
    expect((await put('orders/fresh', 2n ** 31n - 2n)).json().error).toBe('unverified_token');
    expect(await highest('orders/fresh')).toBeNull();
  });

  test('a guarded object cannot be written under an unguarded fence key, so a forged huge token cannot lock the leader out of it', async () => {
    for (const object of ['orders/1', 'orders/not-yet-written']) {
      const res = await app.inject({
        method: 'PUT',
        url: `/v1/objects/${encodeURIComponent(object)}`,
        headers: { 'fencing-token': '9223372036854775807', 'fence-key': 'elsewhere/x' },
        payload: 'forged',
      });
      expect(res.statusCode).toBe(409);
      expect(res.json()).toMatchObject({ error: 'unverified_token', electionPath });
    }
    const del = await app.inject({
      method: 'DELETE',
      url: '/v1/objects/orders%2F1',
      headers: { 'fencing-token': '9223372036854775807', 'fence-key': 'elsewhere/x' },
    });
    expect(del.json().error).toBe('unverified_token');
    expect(await highest('elsewhere/x')).toBeNull();
    // The leader still writes both.
    expect((await put('orders/1', tokenA)).statusCode).toBe(200);
    expect((await put('orders/not-yet-written', tokenA)).statusCode).toBe(200);
  });

  test("a queued candidate's sequence is not the leader's token: refused, and the leader keeps writing", async () => {
    b = await candidate('b');
    const seqB = BigInt(b.nodePath!.slice(-10));
    expect(seqB).toBeGreaterThan(tokenA);
    expect((await put('orders/1', seqB)).json().error).toBe('unverified_token');
    expect((await put('orders/1', tokenA)).statusCode).toBe(200);
  });

  test("a client without the elections' credentials can neither plant a low-sequence candidate nor delete the leader's node, and the guard is not fooled", async () => {
    const forger = await zk();
    const leaderNode = a.nodePath!;
    const plant = `${electionPath}/c_${randomUUID()}_1-0000000000`; // would sort before the leader (token 0 came and went)
    expect(await zkRefusal(forger.create(plant, null, zookeeper.CreateMode.EPHEMERAL))).toBe(ZK_CODES.NO_AUTH);
    expect(await zkRefusal(forger.remove(leaderNode))).toBe(ZK_CODES.NO_AUTH);
    // Nor with the same user name and another password.
    const impostor = await zk({ user: AUTH.user, password: 'guessed' });
    expect(await zkRefusal(impostor.create(plant, null, zookeeper.CreateMode.EPHEMERAL))).toBe(ZK_CODES.NO_AUTH);
    expect(await zkRefusal(impostor.remove(leaderNode))).toBe(ZK_CODES.NO_AUTH);
    // The leader is still the lowest node: its token raises a fresh fence, the planted sequence does not.
    expect((await put('orders/fresh-after-forgery', 0n)).json().error).toBe('unverified_token');
    expect((await put('orders/fresh-after-forgery', tokenA)).statusCode).toBe(200);
    expect(await highest('orders/fresh-after-forgery')).toBe(tokenA.toString());
  });

  test('a stale token below the fence is refused as stale_token, without ZooKeeper', async () => {
    const reads = app.forgeryGuard!.zkReads;
    const res = await put('orders/1', tokenA - 1n);
    expect(res.json().error).toBe('stale_token');
    expect(app.forgeryGuard!.zkReads).toBe(reads);
  });

  test('after a handover the new leader raises the fence and the old token is stale', async () => {
    await a.close();
    const tokenB = await b.waitForLeadership();
    expect((await put('orders/1', tokenB)).statusCode).toBe(200);
    expect(await highest('orders/1')).toBe(tokenB.toString());
    expect((await put('orders/1', tokenA)).json().error).toBe('stale_token');
  });

  test('fence keys outside the mapped prefixes are not guarded; the longest prefix picks the election', async () => {
    expect((await put('payments/1', 9223372036854775807n)).statusCode).toBe(200);
    expect(app.forgeryGuard!.pathFor('orders/audit/7')).toBe(`${electionPath}-audit`);
    // Nobody leads the audit election, so nothing can raise its fences.
    expect((await put('orders/audit/7', b.token!)).json().error).toBe('unverified_token');
  });
});

test("the guard trusts no election path that others than the elections' identity could write: a planted lowest node raises nothing", async () => {
  // Open to anyone (created without credentials, as before ZK_AUTH): the forger plants sequence 1.
  const forger = await zk();
  await forger.mkdirp(forged.open);
  await forger.create(`${forged.open}/${plantedName()}`, null, zookeeper.CreateMode.EPHEMERAL);
  // Created under the elections' user name with another password: ZooKeeper shows both as `elector:x`
  // to a session without admin rights there, so the guard reads with the real credentials.
  const impostor = await zk({ user: AUTH.user, password: 'guessed' });
  const impostorAcl = electionAcl(digestId({ user: AUTH.user, password: 'guessed' }));
  await impostor.mkdirp(forged.otherPassword, impostorAcl);
  await impostor.create(`${forged.otherPassword}/${plantedName()}`, null, zookeeper.CreateMode.EPHEMERAL, impostorAcl);
  // Open when the forger planted, locked to the real identity afterwards (as an operator would):
  // the ACL is right now, but the planted node predates it (ACL version 1).
  await forger.mkdirp(forged.relocked);
  await forger.create(`${forged.relocked}/${plantedName()}`, null, zookeeper.CreateMode.EPHEMERAL);
  await new Promise<void>((resolve, reject) => {
    const c = zookeeper.createClient(inject('zkConnect'));
    c.once('connected', () =>
      c.setACL(
        forged.relocked,
        electionAcl(digestId(AUTH)).map((e) => new zookeeper.ACL(e.perms, new zookeeper.Id(e.scheme, e.id))),
        -1,
        (e) => {
          c.close();
          if (e) reject(e);
          else resolve();
        },
      ),
    );
    c.connect();
  });

  for (const prefix of ['planted/open/', 'planted/other/', 'planted/relocked/']) {
    const res = await put(`${prefix}k`, 1n);
    expect(res.statusCode, prefix).toBe(409);
    expect(res.json().error, prefix).toBe('unverified_token');
    expect(await highest(`${prefix}k`), prefix).toBeNull();
  }
  // The refusal names the configuration problem, not a forgery.
  const open = (await put('planted/open/k', 1n)).json();
  expect(open.message).toMatch(/^election path \S+ not trusted: created without these credentials \(ACL\)/);
  expect(open.untrusted).toMatch(/^created without these credentials \(ACL\): its ACL \(world:anyone:cdrwa\)/);
  expect((await put('planted/relocked/k', 1n)).json().message).toMatch(/not trusted: its ACL was changed after it was created/);
});

test('ZooKeeper unreachable: a raise gets 503 unavailable, writes that cannot raise go through', async () => {
  const down = buildApp({
    store: new FenceStore(db.pool, STORE_DEFAULTS),
    bodyLimitBytes: 1024,
    forgeryGuard: {
      zkConnect: `127.0.0.1:${await closedPort()}`,
      electionAuth: AUTH,
      mappings: [{ prefix: 'zk-down/', electionPath }],
      connectTimeoutMs: 300,
    },
  });
  try {
    await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('zk-down/1', 50)`);
    const ok = await down.inject({ method: 'PUT', url: '/v1/objects/zk-down%2F1', headers: { 'fencing-token': '50' }, payload: 'v' });
    expect(ok.statusCode).toBe(200);
    const raise = await down.inject({ method: 'PUT', url: '/v1/objects/zk-down%2F1', headers: { 'fencing-token': '51' }, payload: 'v' });
    expect(raise.statusCode).toBe(503);
    expect(raise.json().error).toBe('unavailable');
    expect(await highest('zk-down/1')).toBe('50');
  } finally {
    await down.close();
  }
});

test('the guard checks the fence key a protected prefix resolves, also when Postgres refused first: a forged token gets unverified_token without Fence-Key', async () => {
  // Objects under unguarded prefixes, fenced by guarded fence keys (under orders/).
  await protectPrefix(db.pool, 'guarded-jobs/', 'orders/jobs');
  await app.fence.protectedPrefixes.refresh();
  const forgedPut = (key: string) =>
    app.inject({
      method: 'PUT',
      url: `/v1/objects/${encodeURIComponent(key)}`,
      headers: { 'fencing-token': '9223372036854775807' },
      payload: 'forged',
    });
  const res = await forgedPut('guarded-jobs/1');
  expect(res.statusCode, res.body).toBe(409);
  expect(res.json()).toMatchObject({ error: 'unverified_token', fenceKey: 'orders/jobs', electionPath });
  // Declared after the proxy read the list: the first attempt (under the object's own, unguarded
  // key) is refused by Postgres, and the one under the prefix's fence key is admitted again.
  await protectPrefix(db.pool, 'guarded-late/', 'orders/late');
  const late = await forgedPut('guarded-late/1');
  expect(late.statusCode, late.body).toBe(409);
  expect(late.json()).toMatchObject({ error: 'unverified_token', fenceKey: 'orders/late', electionPath });
  for (const key of ['guarded-jobs/1', 'guarded-late/1', 'orders/jobs', 'orders/late']) expect(await highest(key), key).toBeNull();
  expect((await db.pool.query(`SELECT 1 FROM fencepost.objects WHERE starts_with(key, 'guarded-')`)).rowCount).toBe(0);
});
