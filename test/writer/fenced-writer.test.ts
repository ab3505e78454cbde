// The writer client against a real proxy (real Postgres) and real ZooKeeper elections.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { inject } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { Election } from '../../src/election/index.ts';
import { FencedWriter, NotLeaderError, ProxyClient, ProxyError, StaleTokenError } from '../../src/writer/index.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { listen, testApp } from '../support/proxy.ts';
import { uniquePath, waitFor } from '../support/election.ts';

let db: TestDatabase;
let app: FastifyInstance;
let url: string;
const elections: Election[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  app = testApp(db.pool);
  url = await listen(app);
});
afterAll(async () => {
  await Promise.all(elections.map((e) => e.close()));
  await app.close();
  await db.drop();
});

async function candidate(path: string, id: string): Promise<Election> {
  const e = new Election({ connect: inject('zkConnect'), path, id, sessionTimeoutMs: 4000 });
  elections.push(e);
  await e.start();
  return e;
}

async function fenceAccepted(fenceKey: string): Promise<number> {
  return (await new ProxyClient(url).fence(fenceKey))?.accepted ?? 0;
}

describe('FencedWriter', () => {
  test('on election it advances the fence before writing, and every write carries the term token and fence key', async () => {
    const path = uniquePath('writer-advance');
    const fenceKey = `fk-${path}`;
    const a = await candidate(path, 'a');
    const w = new FencedWriter({ election: a, proxy: url, fenceKey });
    const token = await w.waitUntilReady();
    expect(token).toBe(a.token);
    expect((await new ProxyClient(url).fence(fenceKey))?.highestToken).toBe(token);
    const r = await w.put('obj-1', 'hello', { contentType: 'text/plain' });
    expect(r).toMatchObject({ fenceKey, token, version: 1 });
    const stored = await new ProxyClient(url).get('obj-1');
    expect(stored?.token).toBe(token);
    expect(stored?.body.toString()).toBe('hello');
    w.close();
  });

  test('a write attempted while not leader fails fast with NotLeaderError and sends no request', async () => {
    const path = uniquePath('writer-follower');
    const fenceKey = `fk-${path}`;
    const leader = await candidate(path, 'leader');
    const lw = new FencedWriter({ election: leader, proxy: url, fenceKey });
    await lw.waitUntilReady();
    const follower = await candidate(path, 'follower');
    const fw = new FencedWriter({ election: follower, proxy: url, fenceKey });
    const before = await fenceAccepted(fenceKey);
    await expect(fw.put('never', 'x')).rejects.toBeInstanceOf(NotLeaderError);
    await expect(fw.delete('never')).rejects.toBeInstanceOf(NotLeaderError);
    expect(await fenceAccepted(fenceKey)).toBe(before);
    expect((await new ProxyClient(url).fence(fenceKey))?.rejected).toBe(0);
    lw.close();
    fw.close();
  });

  test('a 409 makes the writer step down (resign) with a typed StaleTokenError, and the next candidate takes over', async () => {
    const path = uniquePath('writer-stale');
    const fenceKey = `fk-${path}`;
    const a = await candidate(path, 'a');
    const b = await candidate(path, 'b');
    const wa = new FencedWriter({ election: a, proxy: url, fenceKey });
    const wb = new FencedWriter({ election: b, proxy: url, fenceKey });
    const tokenA = await wa.waitUntilReady();
    // Someone with a newer token (a leader elsewhere) has moved the fence on.
    await new ProxyClient(url).advanceFence(fenceKey, tokenA + 1000n);
    const steppedDown = new Promise((r) => wa.once('stepped-down', r));
    const err = await wa.put('k', 'zombie').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StaleTokenError);
    expect((err as StaleTokenError).highestToken).toBe(tokenA + 1000n);
    await steppedDown;
    expect(a.isLeader).toBe(false);
    await waitFor(() => b.isLeader, 10_000, 'b to lead after a resigned');
    expect(b.token! > tokenA).toBe(true);
    expect(await new ProxyClient(url).get('k')).toBeNull();
    wa.close();
    wb.close();
  });

  test('a fence advance the proxy refuses (4xx) makes the writer resign and waitUntilReady reject, so another replica can lead', async () => {
    const path = uniquePath('writer-refused');
    const a = await candidate(path, 'a');
    const b = await candidate(path, 'b');
    const bad = 'x'.repeat(1025); // over the key limit: 400 invalid_key, which no retry will fix
    const wa = new FencedWriter({ election: a, proxy: url, fenceKey: bad });
    const err = await wa.waitUntilReady().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProxyError);
    expect((err as ProxyError).code).toBe('invalid_key');
    await waitFor(() => b.isLeader, 10_000, 'b to lead after a resigned');
    expect(a.isLeader).toBe(false);
    wa.close();
  });

  test("a new leader's fence advance locks a zombie out of a key the new leader has not written yet", async () => {
    const path = uniquePath('writer-zombie');
    const fenceKey = `fk-${path}`;
    const a = await candidate(path, 'a');
    const b = await candidate(path, 'b');
    const wa = new FencedWriter({ election: a, proxy: url, fenceKey });
    const wb = new FencedWriter({ election: b, proxy: url, fenceKey });
    const zombieToken = await wa.waitUntilReady();
    await wa.put('ledger/1', 'from a');
    // A's session goes away (as if partitioned); it keeps its token like a paused process would.
    wa.close();
    await a.close();
    const newToken = await wb.waitUntilReady();
    expect(newToken > zombieToken).toBe(true);
    // The zombie writes a key no one has written under this fence since B's advance.
    const zombie = new ProxyClient(url, { writerId: 'a-zombie' });
    const err = await zombie.put('ledger/2', 'from zombie', { token: zombieToken, fenceKey }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StaleTokenError);
    expect(await zombie.get('ledger/2')).toBeNull();
    // B can still write it.
    expect((await wb.put('ledger/2', 'from b')).token).toBe(newToken);
    wb.close();
  });
});
