// A fence row held by another session (a long or hostile transaction) fails only that fence's
// writes, after the pool's lock_timeout, with 503 unavailable and nothing committed; writes on
// every other fence commit as usual, also when they shared a batch with the locked fence.
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { testApp } from '../support/proxy.ts';
import { createPool } from '../../src/proxy/server.ts';
import { ConfigError, loadConfig } from '../../src/proxy/config.ts';
import { FenceStore, type FencedOp } from '../../src/fence/store.ts';
import { sqlState } from '../../src/fence/pg-errors.ts';
import { LOCK_NOT_AVAILABLE } from '../../src/fence/sqlstate.ts';

/** Small, so the locked fence's writes fail quickly; the product default is in config.ts. */
const LOCK_TIMEOUT_MS = 100;

let db: TestDatabase;
let pool: pg.Pool;
beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 4 });
  pool = createPool(db.url, 6, { lockTimeoutMs: LOCK_TIMEOUT_MS });
});
afterAll(async () => {
  await pool.end();
  await db.drop();
});

/** A session holding the fence row locked, as a transaction that touched it would, until release(). */
async function holdFence(fenceKey: string): Promise<{ release(): Promise<void> }> {
  const holder = new pg.Client({ connectionString: db.url });
  await holder.connect();
  await holder.query('BEGIN');
  const { rowCount } = await holder.query('SELECT fence_key FROM fencepost.fences WHERE fence_key = $1 FOR UPDATE', [fenceKey]);
  expect(rowCount).toBe(1);
  return {
    release: async () => {
      await holder.query('COMMIT');
      await holder.end();
    },
  };
}

function put(app: FastifyInstance, key: string, fenceKey: string, token: number) {
  return app.inject({
    method: 'PUT',
    url: `/v1/objects/${encodeURIComponent(key)}`,
    headers: { 'fencing-token': String(token), 'fence-key': fenceKey, 'content-type': 'text/plain' },
    payload: key,
  });
}

async function storedKeys(prefix: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ key: string }>('SELECT key FROM fencepost.objects WHERE starts_with(key, $1) ORDER BY key', [
    prefix,
  ]);
  return rows.map((r) => r.key);
}

// Default concurrency (2): the locked fence's writes hold at most one slot. Concurrency 1: every
// write on the free fence queues behind them, and would share batches with them.
describe.each([
  { concurrency: 2, a: 'lt-A', b: 'lt-B' },
  { concurrency: 1, a: 'lt1-A', b: 'lt1-B' },
])('one fence locked by another session, write concurrency $concurrency', ({ concurrency, a, b }) => {
  let app: FastifyInstance;
  let lock: { release(): Promise<void> };
  beforeAll(async () => {
    app = testApp(pool, { concurrency });
    expect((await put(app, `${a}/seed`, a, 5)).statusCode).toBe(200);
    expect((await put(app, `${b}/seed`, b, 5)).statusCode).toBe(200);
    lock = await holdFence(a);
  });
  afterAll(async () => {
    await app.close();
  });

  test('of 60 concurrent writes, every one on the free fence commits and every one on the locked fence gets 503 unavailable and commits nothing', async () => {
    const writes = Array.from({ length: 30 }, (_, i) => [
      { fence: a, key: `${a}/${String(i).padStart(2, '0')}` },
      { fence: b, key: `${b}/${String(i).padStart(2, '0')}` },
    ]).flat();
    const replies = await Promise.all(writes.map((w) => put(app, w.key, w.fence, 5)));
    const answers = writes.map((w, i) => ({
      ...w,
      status: replies[i]!.statusCode,
      body: replies[i]!.json<{ error?: string; message?: string }>(),
    }));
    const onA = answers.filter((x) => x.fence === a);
    const onB = answers.filter((x) => x.fence === b);
    expect(onB.filter((x) => x.status !== 200)).toEqual([]);
    expect(onA.filter((x) => x.status !== 503 || x.body.error !== 'unavailable')).toEqual([]);
    expect(onA[0]!.body.message).toMatch(/fence busy/);
    expect(replies[0]!.headers['retry-after']).toBe('1');
    expect(await storedKeys(`${b}/`)).toEqual([`${b}/seed`, ...onB.map((x) => x.key)].sort());
    expect(await storedKeys(`${a}/`)).toEqual([`${a}/seed`]);
    const { rows } = await db.pool.query(
      'SELECT fence_key, accepted::int FROM fencepost.fence_stats WHERE fence_key = ANY($1) ORDER BY fence_key',
      [[a, b]],
    );
    expect(rows).toEqual([
      { fence_key: a, accepted: 1 },
      { fence_key: b, accepted: 31 },
    ]);
  });

  test('once the holder commits, writes on that fence succeed again', async () => {
    await lock.release();
    const replies = await Promise.all([put(app, `${a}/after-1`, a, 6), put(app, `${a}/after-2`, a, 6), put(app, `${b}/after`, b, 6)]);
    expect(replies.map((r) => r.statusCode)).toEqual([200, 200, 200]);
    expect(await storedKeys(`${a}/`)).toEqual([`${a}/after-1`, `${a}/after-2`, `${a}/seed`]);
  });
});

describe('FenceStore batches around a locked fence', () => {
  const putOp = (key: string, fenceKey: string): FencedOp => ({
    kind: 'put',
    key,
    fenceKey,
    token: 1n,
    contentType: 'text/plain',
    body: Buffer.from(key),
    writerId: null,
  });

  test('a batch that mixes a locked fence with free ones commits the free writes; only the locked one fails with 55P03', async () => {
    const sizes: number[] = [];
    const store = new FenceStore(pool, { ...STORE_DEFAULTS, concurrency: 1, onBatch: (n) => sizes.push(n) });
    await store.write(putOp('mix/seed', 'mix-A'));
    sizes.length = 0;
    const lock = await holdFence('mix-A');
    try {
      // The first write takes the only slot; the next two queue and go out together in one statement.
      const first = store.write(putOp('mix/first', 'mix-X'));
      const locked = store.write(putOp('mix/a', 'mix-A'));
      const free = store.write(putOp('mix/b', 'mix-B'));
      await expect(first).resolves.toMatchObject({ accepted: true });
      await expect(free).resolves.toMatchObject({ accepted: true });
      const err = await locked.then(
        () => null,
        (e: unknown) => e,
      );
      expect(sqlState(err)).toBe(LOCK_NOT_AVAILABLE);
      await store.idle();
      expect(sizes).toEqual([1, 2, 1, 1]); // the batch of two failed whole, then each ran alone
      expect(await storedKeys('mix/')).toEqual(['mix/b', 'mix/first', 'mix/seed']);
    } finally {
      await lock.release();
    }
  });

  test('a fence key whose lone write hit the lock timeout is not batched with other keys while it stays locked', async () => {
    const sizes: number[] = [];
    const store = new FenceStore(pool, { ...STORE_DEFAULTS, concurrency: 1, onBatch: (n) => sizes.push(n) });
    await store.write(putOp('alone/seed', 'alone-A'));
    const lock = await holdFence('alone-A');
    try {
      await expect(store.write(putOp('alone/a1', 'alone-A'))).rejects.toMatchObject({ code: LOCK_NOT_AVAILABLE });
      sizes.length = 0;
      const first = store.write(putOp('alone/first', 'alone-X'));
      const locked = store.write(putOp('alone/a2', 'alone-A'));
      const free = store.write(putOp('alone/b', 'alone-B'));
      await expect(first).resolves.toMatchObject({ accepted: true });
      await expect(locked).rejects.toMatchObject({ code: LOCK_NOT_AVAILABLE });
      await expect(free).resolves.toMatchObject({ accepted: true });
      await store.idle();
      expect(sizes).toEqual([1, 1, 1]); // never a batch of alone-A with alone-B, so no split
    } finally {
      await lock.release();
    }
    // Released: its next write succeeds, and the key is batched with others again.
    await expect(store.write(putOp('alone/a3', 'alone-A'))).resolves.toMatchObject({ accepted: true });
    expect(await storedKeys('alone/')).toEqual(['alone/a3', 'alone/b', 'alone/first', 'alone/seed']);
  });
});

describe('the leaner statement beside a locked fence', () => {
  const putOp = (key: string, fenceKey: string, token = 1n): FencedOp => ({
    kind: 'put',
    key,
    fenceKey,
    token,
    contentType: 'text/plain',
    body: Buffer.from(key),
    writerId: null,
  });

  // Invariant: a put the leaner statement committed is answered accepted exactly once, even when
  // the full statement for the rest of its batch hits the lock timeout (it is never run again).
  test('a put committed by the leaner statement stays answered when the rest of its batch hits the lock', async () => {
    const store = new FenceStore(pool, { ...STORE_DEFAULTS, concurrency: 1 });
    await store.write(putOp('part/seed-f', 'part-F')); // the store learns part-F's token
    await store.write(putOp('part/seed-l', 'part-L')); // an object under part-L
    const lock = await holdFence('part-L');
    try {
      const first = store.write(putOp('part/first', 'part-X')); // takes the only slot
      const leader = store.write(putOp('part/f', 'part-F')); // the fence's own token: the leaner statement
      // part-L's object named under part-F: left to the full statement, which waits on part-L's lock.
      const crossing = store.write(putOp('part/seed-l', 'part-F'));
      await expect(first).resolves.toMatchObject({ accepted: true });
      await expect(leader).resolves.toMatchObject({ accepted: true, version: 1n });
      await expect(crossing).rejects.toMatchObject({ code: LOCK_NOT_AVAILABLE });
      await store.idle();
    } finally {
      await lock.release();
    }
    const { rows } = await db.pool.query(
      `SELECT key, fence_key, version::text FROM fencepost.objects WHERE key IN ('part/f', 'part/seed-l') ORDER BY key`,
    );
    expect(rows).toEqual([
      { key: 'part/f', fence_key: 'part-F', version: '1' },
      { key: 'part/seed-l', fence_key: 'part-L', version: '1' },
    ]);
    expect(await new FenceStore(db.pool, STORE_DEFAULTS).readFence('part-F')).toMatchObject({ accepted: 2n }); // the seed and the leader's put, once
  });

  // Invariant: a batch waiting on a locked fence never holds back writes on other fences (the
  // queue waits for a batch in flight only briefly). Order of answers, not timing: the free write
  // is answered while the locked one still waits for its lock timeout.
  test('a write on a free fence is answered while a batch waits on a locked fence', async () => {
    const slow = createPool(db.url, 4, { lockTimeoutMs: 3000 });
    try {
      const store = new FenceStore(slow, { ...STORE_DEFAULTS, concurrency: 2 });
      await store.write(putOp('hold/seed-l', 'hold-L'));
      await store.write(putOp('hold/seed-m', 'hold-M'));
      const lock = await holdFence('hold-L');
      const answered: string[] = [];
      try {
        const locked = store.write(putOp('hold/l', 'hold-L')).finally(() => answered.push('locked'));
        const free = store.write(putOp('hold/m', 'hold-M')).finally(() => answered.push('free'));
        await expect(free).resolves.toMatchObject({ accepted: true });
        expect(answered).toEqual(['free']);
        await lock.release();
        await expect(locked).resolves.toMatchObject({ accepted: true });
      } finally {
        await lock.release().catch(() => {});
      }
      await store.idle();
    } finally {
      await slow.end();
    }
  });

  // Invariant: counting folds and count reads never wait for counter rows a writer's statement or
  // transaction holds (shards 0–63): they answer under the lock timeout, with the pending count.
  test('reads of the counts and the fold never wait for counter rows writers hold', async () => {
    const store = new FenceStore(pool, STORE_DEFAULTS);
    await store.write(putOp('fold/seed', 'fold-K'));
    await db.pool.query(
      `INSERT INTO fencepost.fence_counts (fence_key, shard) SELECT 'fold-K', g FROM generate_series(0, 63) g ON CONFLICT DO NOTHING`,
    );
    await db.pool.query(`INSERT INTO fencepost.totals (shard) SELECT g FROM generate_series(0, 63) g ON CONFLICT DO NOTHING`);
    await db.pool.query(`INSERT INTO fencepost.pending_counts (fence_key) VALUES ('fold-K'), ('fold-K')`);
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    await holder.query('BEGIN');
    await holder.query(`SELECT 1 FROM fencepost.fence_counts WHERE shard < 64 FOR UPDATE`);
    await holder.query(`SELECT 1 FROM fencepost.totals WHERE shard < 64 FOR UPDATE`);
    try {
      expect(await store.readFence('fold-K')).toMatchObject({ accepted: 3n }); // the seed and two pending
      const before = (await store.stats(10)).accepted;
      await Promise.all(Array.from({ length: 6 }, () => store.foldPendingCounts()));
      expect((await db.pool.query('SELECT count(*)::int AS n FROM fencepost.pending_counts')).rows[0].n).toBe(0);
      expect(await store.readFence('fold-K')).toMatchObject({ accepted: 3n });
      expect((await store.stats(10)).accepted).toBe(before);
      expect((await store.listFences(null, 1000)).fences.find((f) => f.fenceKey === 'fold-K')).toMatchObject({ accepted: 3n });
    } finally {
      await holder.query('COMMIT');
      await holder.end();
    }
  });
});

describe('FENCEPOST_LOCK_TIMEOUT_MS', () => {
  test('defaults to 1000 ms', () => {
    expect(loadConfig({}).lockTimeoutMs).toBe(1000);
  });

  test.each([
    [{ FENCEPOST_LOCK_TIMEOUT_MS: '0' }],
    [{ FENCEPOST_LOCK_TIMEOUT_MS: '1.5' }],
    [{ FENCEPOST_LOCK_TIMEOUT_MS: 'soon' }],
    // At or above the statement timeout, a locked fence would hold its writes until that fires.
    [{ FENCEPOST_LOCK_TIMEOUT_MS: '2000', FENCEPOST_STATEMENT_TIMEOUT_MS: '2000' }],
  ])('a bad value (%j) fails fast naming the variable', (env) => {
    expect(() => loadConfig(env)).toThrow(ConfigError);
    expect(() => loadConfig(env)).toThrow('FENCEPOST_LOCK_TIMEOUT_MS');
  });

  test('may be anything below the statement timeout, or anything when the statement timeout is off', () => {
    expect(loadConfig({ FENCEPOST_LOCK_TIMEOUT_MS: '1999', FENCEPOST_STATEMENT_TIMEOUT_MS: '2000' }).lockTimeoutMs).toBe(1999);
    expect(loadConfig({ FENCEPOST_LOCK_TIMEOUT_MS: '60000', FENCEPOST_STATEMENT_TIMEOUT_MS: '0' }).lockTimeoutMs).toBe(60000);
  });
});
