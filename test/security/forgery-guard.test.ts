// The token forgery guard against a real ZooKeeper and real elections: a real leader raises its
// fence, a forged token cannot, and nothing a forger sends locks the real leader out.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { inject } from 'vitest';
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { Election } from '../../src/election/election.ts';
import { buildApp } from '../../src/proxy/app.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { freePort } from '../../tools/zookeeper/local-server.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';

let db: TestDatabase;
let app: FastifyInstance;
const electionPath = `/fencepost-test/guard-${randomUUID().slice(0, 8)}`;
const elections: Election[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  app = buildApp({
    store: new FenceStore(db.pool),
    bodyLimitBytes: 1024,
    forgeryGuard: { zkConnect: inject('zkConnect'), mappings: [{ prefix: 'orders/', electionPath }, { prefix: 'orders/audit/', electionPath: `${electionPath}-audit` }] },
  });
  await app.ready();
});
afterAll(async () => {
  await Promise.all(elections.map((e) => e.close()));
  await app.close();
  await db.drop();
});

async function candidate(id: string): Promise<Election> {
  const e = new Election({ connect: inject('zkConnect'), path: electionPath, id, sessionTimeoutMs: 4000 });
  elections.push(e);
  await e.start();
  return e;
}

const put = (fenceKey: string, token: bigint | string) =>
  app.inject({ method: 'PUT', url: `/v1/objects/${encodeURIComponent(fenceKey)}`, headers: { 'fencing-token': token.toString() }, payload: 'v' });
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
    const del = await app.inject({ method: 'DELETE', url: '/v1/objects/orders%2F1', headers: { 'fencing-token': '9223372036854775807', 'fence-key': 'elsewhere/x' } });
    expect(del.json().error).toBe('unverified_token');
    expect(await highest('elsewhere/x')).toBeNull();
    // The leader still writes both.
    expect((await put('orders/1', tokenA)).statusCode).toBe(200);
    expect((await put('orders/not-yet-written', tokenA)).statusCode).toBe(200);
  });

  test('a queued candidate\'s sequence is not the leader\'s token: refused, and the leader keeps writing', async () => {
    b = await candidate('b');
    const seqB = BigInt(b.nodePath!.slice(-10));
    expect(seqB).toBeGreaterThan(tokenA);
    expect((await put('orders/1', seqB)).json().error).toBe('unverified_token');
    expect((await put('orders/1', tokenA)).statusCode).toBe(200);
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

test('ZooKeeper unreachable: a raise gets 503 unavailable, writes that cannot raise go through', async () => {
  const down = buildApp({
    store: new FenceStore(db.pool),
    bodyLimitBytes: 1024,
    forgeryGuard: { zkConnect: `127.0.0.1:${await freePort()}`, mappings: [{ prefix: 'zk-down/', electionPath }], connectTimeoutMs: 300 },
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
