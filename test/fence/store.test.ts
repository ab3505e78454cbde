// FenceStore batching: what each write in a coalesced batch is told when part of the batch fails.
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import { randomBytes } from 'node:crypto';
import { foldPendingCounts } from '../../src/fence/sql/counts.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { FenceStore } from '../../src/fence/store.ts';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 4 });
});
afterAll(async () => {
  await db.drop();
});

/** The test pool, except that recording rejections fails as if the connection dropped. */
function poolFailingRejectionLog(pool: pg.Pool): pg.Pool {
  return new Proxy(pool, {
    get(target, prop, receiver) {
      if (prop !== 'query') return Reflect.get(target, prop, receiver) as unknown;
      return (config: { name?: string }, ...rest: unknown[]) => {
        if (config?.name === 'fencepost_record_rejections') return Promise.reject(new Error('Connection terminated unexpectedly'));
        return (target.query as (...a: unknown[]) => unknown)(config, ...rest);
      };
    },
  });
}

describe('a batch whose rejection log write fails', () => {
  test('a write that committed in the batch is still answered accepted; only the stale one gets the error', async () => {
    // Invariant: a committed write is never reported as failed (a 5xx says "did not commit").
    await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('batch/stale', 100)`);
    const store = new FenceStore(poolFailingRejectionLog(db.pool), { ...STORE_DEFAULTS, concurrency: 1 });
    const put = (key: string, token: bigint) =>
      store.write({ kind: 'put', key, fenceKey: key, token, contentType: 'text/plain', body: Buffer.from(key), writerId: null });
    // The first write takes the only slot; the next two queue and go out together in one statement.
    const first = put('batch/first', 1n);
    const ok = put('batch/ok', 5n);
    const stale = put('batch/stale', 1n);
    await expect(first).resolves.toMatchObject({ accepted: true });
    await expect(stale).rejects.toThrow('Connection terminated');
    await expect(ok).resolves.toMatchObject({ accepted: true, highestToken: 5n, version: 1n });
    const { rows } = await db.pool.query(`SELECT token::text FROM fencepost.objects WHERE key = 'batch/ok'`);
    expect(rows).toEqual([{ token: '5' }]); // it did commit
    await store.idle();
  });
});

/** The test pool, recording each statement's name; after arm(name), the next statement of that name fails as a deadlock would. */
function recordingPool(pool: pg.Pool): { pool: pg.Pool; names: string[]; arm(name: string): void } {
  const names: string[] = [];
  let armed: string | null = null;
  const recorded =
    (query: (...a: unknown[]) => unknown) =>
    (config: { name?: string }, ...rest: unknown[]) => {
      if (config?.name) names.push(config.name);
      if (config?.name !== undefined && config.name === armed) {
        armed = null;
        return Promise.reject(Object.assign(new Error('deadlock detected'), { code: '40P01' }));
      }
      return query(config, ...rest);
    };
  // The store sends its statements on clients it takes with connect(), and reads with query().
  const wrapped = new Proxy(pool, {
    get(target, prop, receiver) {
      if (prop === 'query') return recorded((...a) => (target.query as (...x: unknown[]) => unknown).apply(target, a));
      if (prop === 'connect') {
        return async () => {
          const client = await target.connect();
          return new Proxy(client, {
            get(c, p, r) {
              if (p !== 'query') return Reflect.get(c, p, r) as unknown;
              return recorded((...a) => (c.query as (...x: unknown[]) => unknown).apply(c, a));
            },
          });
        };
      }
      return Reflect.get(target, prop, receiver) as unknown;
    },
  });
  return { pool: wrapped, names, arm: (name) => (armed = name) };
}

describe('a batch of plain puts', () => {
  /** A fence's accepted count as the reads give it: its counter rows and its rows not folded yet. */
  const counts = async (fenceKey: string) => Number((await new FenceStore(db.pool, STORE_DEFAULTS).readFence(fenceKey))?.accepted ?? 0n);

  // Invariant: the cheaper statement applies only puts at their fence's own token on objects of
  // that fence; every other put (stale, raising, another fence's object) is decided by the full
  // statement, exactly as if it had come alone, and each is counted once.
  test("the leader's puts take the cheaper statement; stale, raising and other-fence puts are decided in full", async () => {
    await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('lean/f', 7), ('lean/g', 9), ('lean/slot', 1)`);
    await db.pool.query(
      `INSERT INTO fencepost.objects (key, fence_key, token, version, content_type, body) VALUES ('lean/other', 'lean/g', 9, 1, 'text/plain', 'g')`,
    );
    const rec = recordingPool(db.pool);
    const store = new FenceStore(rec.pool, { ...STORE_DEFAULTS, concurrency: 1 });
    const put = (key: string, fenceKey: string, token: bigint) =>
      store.write({ kind: 'put', key, fenceKey, token, contentType: 'text/plain', body: Buffer.from(key), writerId: 'w' });
    // Each fence's first write goes through the full statement; the store then knows its token.
    await expect(put('lean/seed', 'lean/f', 7n)).resolves.toMatchObject({ accepted: true });
    await expect(put('lean/slot-seed', 'lean/slot', 1n)).resolves.toMatchObject({ accepted: true });
    const first = put('lean/slot-object', 'lean/slot', 1n); // takes the only slot; the next three queue into one batch
    const a1 = put('lean/a1', 'lean/f', 7n);
    const a2 = put('lean/a2', 'lean/f', 7n);
    const other = put('lean/other', 'lean/f', 7n);
    await expect(first).resolves.toMatchObject({ accepted: true });
    await expect(a1).resolves.toMatchObject({ accepted: true, highestToken: 7n, version: 1n });
    await expect(a2).resolves.toMatchObject({ accepted: true, highestToken: 7n, version: 1n });
    await expect(other).resolves.toMatchObject({ accepted: false, fenceKey: 'lean/g', highestToken: 9n });
    await store.idle();
    // A batch with a stale token and a new fence goes through the full statement alone.
    const blocker = put('lean/slot-object2', 'lean/slot', 1n);
    const stale = put('lean/s', 'lean/f', 6n);
    const raising = put('lean/r', 'lean/h', 3n);
    await expect(blocker).resolves.toMatchObject({ accepted: true });
    await expect(stale).resolves.toMatchObject({ accepted: false, highestToken: 7n });
    await expect(raising).resolves.toMatchObject({ accepted: true, highestToken: 3n, version: 1n });
    await store.idle();
    const written = await db.pool.query(
      `SELECT key, fence_key, token::text, version::text FROM fencepost.objects WHERE key LIKE 'lean/%' AND key NOT LIKE 'lean/slot%' ORDER BY key`,
    );
    expect(written.rows).toEqual([
      { key: 'lean/a1', fence_key: 'lean/f', token: '7', version: '1' },
      { key: 'lean/a2', fence_key: 'lean/f', token: '7', version: '1' },
      { key: 'lean/other', fence_key: 'lean/g', token: '9', version: '1' },
      { key: 'lean/r', fence_key: 'lean/h', token: '3', version: '1' },
      { key: 'lean/seed', fence_key: 'lean/f', token: '7', version: '1' },
    ]);
    expect([await counts('lean/f'), await counts('lean/h'), await counts('lean/slot')]).toEqual([3, 1, 3]);
    expect(rec.names.filter((n) => n.startsWith('fencepost_fenced'))).toEqual([
      'fencepost_fenced_write', // lean/seed: first write of its fence
      'fencepost_fenced_write', // lean/slot-seed
      'fencepost_fenced_puts', // lean/slot-object
      'fencepost_fenced_puts', // a1, a2, other: the cheaper statement applies a1 and a2…
      'fencepost_fenced_write', // …and the full one refuses other
      'fencepost_fenced_puts', // lean/slot-object2
      'fencepost_fenced_write', // stale and raising: the full statement alone
    ]);
  });

  // Invariant: in one batch of the cheaper statement (its bodies travel as one bytea with offsets),
  // every object reads back exactly its own bytes: empty, one byte, binary, large, side by side.
  test('bodies of one batch of the cheaper statement come back byte for byte', async () => {
    await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('bodies/f', 4)`);
    const rec = recordingPool(db.pool);
    const store = new FenceStore(rec.pool, { ...STORE_DEFAULTS, concurrency: 1 });
    const put = (key: string, body: Buffer) =>
      store.write({ kind: 'put', key, fenceKey: 'bodies/f', token: 4n, contentType: 'application/octet-stream', body, writerId: null });
    await expect(put('bodies/seed', Buffer.from('seed'))).resolves.toMatchObject({ accepted: true });
    const bodies = [
      Buffer.alloc(0),
      Buffer.from([0]),
      Buffer.from([0x5c, 0x78, 0x22, 0x7b, 0x2c, 0x7d, 0xff]),
      Buffer.alloc(70_000, 7),
      Buffer.alloc(0),
      Buffer.from('{"a":"\\x00"}'),
      randomBytes(513),
    ];
    const blocker = put('bodies/blocker', Buffer.from('b')); // takes the only slot; the rest queue into one batch
    const writes = bodies.map((b, i) => put(`bodies/${i}`, b));
    await blocker;
    for (const w of writes) await expect(w).resolves.toMatchObject({ accepted: true, version: 1n });
    await store.idle();
    const { rows } = await db.pool.query<{ key: string; body: Buffer }>(
      `SELECT key, body FROM fencepost.objects WHERE key LIKE 'bodies/_' ORDER BY key`,
    );
    expect(rows.map((r) => r.body.toString('hex'))).toEqual(bodies.map((b) => b.toString('hex')));
    expect(rec.names.filter((n) => n.startsWith('fencepost_fenced')).slice(-1)).toEqual(['fencepost_fenced_puts']);
    // The same through the full statement: a batch that raises a fence and deletes an object.
    const putG = (key: string, body: Buffer) =>
      store.write({ kind: 'put', key, fenceKey: 'bodies/g', token: 2n, contentType: 'application/octet-stream', body, writerId: null });
    const blocker2 = put('bodies/blocker', Buffer.from('c'));
    const del = store.write({ kind: 'delete', key: 'bodies/0', fenceKey: 'bodies/f', token: 4n, writerId: null });
    const raised = bodies.map((b, i) => putG(`bodies/g${i}`, b));
    await blocker2;
    await expect(del).resolves.toMatchObject({ accepted: true });
    for (const w of raised) await expect(w).resolves.toMatchObject({ accepted: true, version: 1n });
    await store.idle();
    const g = await db.pool.query<{ key: string; body: Buffer }>(
      `SELECT key, body FROM fencepost.objects WHERE key LIKE 'bodies/g_' ORDER BY key`,
    );
    expect(g.rows.map((r) => r.body.toString('hex'))).toEqual(bodies.map((b) => b.toString('hex')));
    expect((await db.pool.query(`SELECT 1 FROM fencepost.objects WHERE key = 'bodies/0'`)).rowCount).toBe(0);
    expect(rec.names.filter((n) => n.startsWith('fencepost_fenced')).slice(-1)).toEqual(['fencepost_fenced_write']);
  });

  // Invariant: a retry repeats only the statement that failed: puts the cheaper statement
  // committed are not applied (or counted) a second time when the full statement after it hits a
  // deadlock and runs again.
  test('a deadlock in the second statement retries that statement only', async () => {
    await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('retry/f', 4), ('retry/g', 5), ('retry/slot', 1)`);
    await db.pool.query(
      `INSERT INTO fencepost.objects (key, fence_key, token, version, content_type, body) VALUES ('retry/other', 'retry/g', 5, 1, 'text/plain', 'g')`,
    );
    const rec = recordingPool(db.pool);
    const store = new FenceStore(rec.pool, { ...STORE_DEFAULTS, concurrency: 1 });
    const put = (key: string, fenceKey: string, token: bigint) =>
      store.write({ kind: 'put', key, fenceKey, token, contentType: 'text/plain', body: Buffer.from(key), writerId: null });
    await expect(put('retry/seed', 'retry/f', 4n)).resolves.toMatchObject({ accepted: true }); // the store learns each fence's token
    await expect(put('retry/slot-seed', 'retry/slot', 1n)).resolves.toMatchObject({ accepted: true });
    rec.names.length = 0;
    rec.arm('fencepost_fenced_write');
    const first = put('retry/slot-object', 'retry/slot', 1n); // takes the only slot; the next two share a batch
    const leader = put('retry/a', 'retry/f', 4n); // applied by the cheaper statement
    const other = put('retry/other', 'retry/f', 4n); // another fence's object: left to the full statement, which fails once
    await expect(first).resolves.toMatchObject({ accepted: true });
    await expect(leader).resolves.toMatchObject({ accepted: true, version: 1n });
    await expect(other).resolves.toMatchObject({ accepted: false, fenceKey: 'retry/g', highestToken: 5n });
    await store.idle();
    const v = await db.pool.query(`SELECT key, version::text FROM fencepost.objects WHERE key IN ('retry/a', 'retry/other') ORDER BY key`);
    expect(v.rows).toEqual([
      { key: 'retry/a', version: '1' },
      { key: 'retry/other', version: '1' },
    ]);
    expect(await counts('retry/f')).toBe(2); // the seed and retry/a, once each
    expect(rec.names.filter((n) => n.startsWith('fencepost_fenced'))).toEqual([
      'fencepost_fenced_puts',
      'fencepost_fenced_puts',
      'fencepost_fenced_write',
      'fencepost_fenced_write',
    ]);
  });
});

describe('folding committed transactions into the counters', () => {
  // Invariant: a fold counts every pending row once, whatever the table looked like when the
  // connection first folded (a plan cached on the empty table re-ran its locking subquery per
  // row: 10,000 rows took 5 s). The statement timeout is 100 times what the fold needs.
  test('a fold on a connection that first folded an empty table folds 20,000 rows at once', async () => {
    const c = new pg.Client({ connectionString: db.url, options: '-c statement_timeout=5000' });
    await c.connect();
    try {
      await c.query('DELETE FROM fencepost.pending_counts');
      await c.query('VACUUM fencepost.pending_counts');
      await c.query(foldPendingCounts());
      await c.query(`INSERT INTO fencepost.pending_counts (fence_key) SELECT 'plan/k' FROM generate_series(1, 20000)`);
      await c.query(foldPendingCounts());
      expect((await c.query('SELECT count(*)::int AS n FROM fencepost.pending_counts')).rows[0].n).toBe(0);
      expect((await c.query(`SELECT sum(accepted)::int AS n FROM fencepost.fence_counts WHERE fence_key = 'plan/k'`)).rows[0].n).toBe(
        20000,
      );
    } finally {
      await c.end();
    }
  });
});
