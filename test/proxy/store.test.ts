// FenceStore batching: what each write in a coalesced batch is told when part of the batch fails.
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type pg from 'pg';
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
    const put = (key: string, token: bigint) => store.write({ kind: 'put', key, fenceKey: key, token, contentType: 'text/plain', body: Buffer.from(key), writerId: null });
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
