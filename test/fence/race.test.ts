// Concurrent writers with mixed tokens on one fence key, through one and through two proxy
// instances on one database. Invariants (checkRace): every accepted write's token is ≥ every
// token acknowledged before it was sent; per object, accepted writes in commit (version) order
// have gapless versions and non-decreasing tokens; plus the database checks below.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { listen, spawnProxy, testApp, type ProxyProcess } from '../support/proxy.ts';
import { checkRace, runRace, type RaceRecord } from '../support/race.ts';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 4 });
});
afterAll(async () => {
  await db.drop();
});

/** Database-side invariants after a race on `fenceKey`. */
async function checkDatabase(base: string, fenceKey: string, objectKeys: string[], records: RaceRecord[]) {
  const accepted = records.filter((r) => r.status === 200);
  const rejected = records.filter((r) => r.status === 409);
  expect(accepted.length).toBeGreaterThan(0);
  expect(rejected.length).toBeGreaterThan(0); // the race really mixed stale tokens in
  for (const key of objectKeys) {
    const mine = accepted.filter((r) => r.objectKey === key);
    const maxToken = mine.reduce((m, r) => (r.token > m ? r.token : m), -1n);
    const res = await fetch(`${base}/v1/objects/${encodeURIComponent(key)}`);
    const body = await res.text();
    if (mine.length === 0) {
      // Every write of this object lost to a higher token beside it: nothing may be stored.
      expect(res.status, `${key} had no accepted write but is stored`).toBe(404);
      continue;
    }
    // The stored object is an accepted write carrying the highest accepted token; never a rejected one.
    const writer = mine.find((r) => r.body === body);
    expect(writer, `stored body of ${key} must come from an accepted write`).toBeDefined();
    expect(rejected.some((r) => r.body === body)).toBe(false);
    expect(BigInt(res.headers.get('fencing-token')!)).toBe(maxToken);
    expect(writer!.token).toBe(maxToken);
  }
  const fence = (await (await fetch(`${base}/v1/fences/${encodeURIComponent(fenceKey)}`)).json()) as { accepted: number; rejected: number };
  expect(fence.accepted).toBe(accepted.length);
  expect(fence.rejected).toBe(rejected.length);
  expect(fence.accepted + fence.rejected).toBe(records.length);
  type Counts = { fenceKey: string; accepted: number; rejected: number };
  const stats = (await (await fetch(`${base}/v1/stats?limit=1000`)).json()) as { byFenceKey: Counts[] };
  const mine = stats.byFenceKey.find((f) => f.fenceKey === fenceKey)!;
  expect(mine.accepted + mine.rejected).toBe(records.length);
  const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM fencepost.rejections WHERE fence_key = $1', [fenceKey]);
  expect(rows[0].n).toBe(rejected.length);
}

describe('race on one fence key', () => {
  test('32 concurrent writers through one proxy never get a stale write accepted', async () => {
    const app: FastifyInstance = testApp(db.pool, { concurrency: 2 });
    const base = await listen(app);
    try {
      const fenceKey = 'race-one';
      const objectKeys = ['race-one/a', 'race-one/b', 'race-one/c'];
      const records = await runRace({ urls: [base], fenceKey, objectKeys, writers: 32, writesPerWriter: 25 });
      expect(checkRace(records)).toEqual([]);
      await checkDatabase(base, fenceKey, objectKeys, records);
    } finally {
      await app.close();
    }
  });

  test('32 concurrent writers through two proxy processes on one database never get a stale write accepted', async () => {
    const env = { DATABASE_URL: db.url, FENCEPOST_POOL_SIZE: '4' };
    const proxies: ProxyProcess[] = await Promise.all([spawnProxy(env), spawnProxy(env)]);
    try {
      const fenceKey = 'race-two';
      const objectKeys = ['race-two/a', 'race-two/b'];
      const records = await runRace({ urls: proxies.map((p) => p.url), fenceKey, objectKeys, writers: 32, writesPerWriter: 25 });
      expect(checkRace(records)).toEqual([]);
      // Both instances answered from the fence, and each answers the stats from the database.
      for (const p of proxies) expect(records.some((r) => r.url === p.url && (r.status === 200 || r.status === 409))).toBe(true);
      for (const p of proxies) await checkDatabase(p.url, fenceKey, objectKeys, records);
    } finally {
      await Promise.all(proxies.map((p) => p.stop()));
    }
  });

  test('the same race catches the classic bug: check and write in two statements (two-step mode)', async () => {
    // Guards the guard on real servers: with the check outside the write, stale writes get in.
    const env = { DATABASE_URL: db.url, FENCEPOST_POOL_SIZE: '4' };
    const proxies: ProxyProcess[] = await Promise.all([spawnProxy(env, 60_000, 'two-step'), spawnProxy(env, 60_000, 'two-step')]);
    try {
      // Stale writes get through only when a check and a raise interleave; up to three races.
      let violations = 0;
      for (let round = 0; round < 3 && violations === 0; round++) {
        const records = await runRace({
          urls: proxies.map((p) => p.url),
          fenceKey: `race-broken-${round}`,
          objectKeys: ['race-broken/a'],
          writers: 32,
          writesPerWriter: 25,
        });
        violations = checkRace(records).length;
      }
      expect(violations).toBeGreaterThan(0);
    } finally {
      await Promise.all(proxies.map((p) => p.stop()));
    }
  });

  test('the checker catches a history where a stale write was accepted', () => {
    // Guards the guard: a write sent after token 7 was acknowledged, accepted with token 6.
    const base = { writer: 0, url: '', objectKey: 'k', body: '', status: 200 };
    const bad: RaceRecord[] = [
      { ...base, token: 7n, sentAt: 0, ackedAt: 1, version: 1, body: 'a' },
      { ...base, token: 6n, sentAt: 2, ackedAt: 3, version: 2, body: 'b' },
    ];
    expect(checkRace(bad).length).toBeGreaterThan(0);
  });
});
