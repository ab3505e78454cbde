// The object rule: an object keeps the fence key of its last write, and a write or delete that names
// another fence key needs a token ≥ the CURRENT highest token of the object's fence (besides passing
// its own). So a deposed leader cannot step around the fence that deposed it by naming another one.
// Story: L1 writes inv/7 with token 5; L2 raises fence inv/7 to 6; L1, still holding 5, names
// Fence-Key inv/7-alt. Through one proxy, through two proxies over one database, and against a raise
// or a move of the object still in flight.
import { describe, expect } from 'vitest';
import type { FastifyInstance } from 'fastify';
import type { TestDatabase } from '../support/db.ts';
import { twoProxiesTest as test } from '../support/fixtures.ts';
import { deleteObject, putObject, raiseFence, storedObject } from '../support/objects.ts';

// Two proxies over one database (fixtures.ts twoProxiesTest): `a`, and `b`, which shares nothing
// with it but Postgres.
let n = 0;
const uniq = (p: string) => `${p}-${++n}`;

async function fenceCounts(db: TestDatabase, fenceKey: string) {
  const { rows } = await db.pool.query('SELECT highest_token, accepted, rejected FROM fencepost.fence_stats WHERE fence_key = $1', [
    fenceKey,
  ]);
  return rows[0] ?? null;
}
async function rejectionsOf(db: TestDatabase, key: string) {
  const { rows } = await db.pool.query(
    'SELECT fence_key, operation, token, highest_token FROM fencepost.rejections WHERE object_key = $1 ORDER BY id',
    [key],
  );
  return rows;
}

/** L1 writes `key` under its own fence with token 5, then L2 (through `l2`) raises that fence to 6. */
async function deposeL1(l1: FastifyInstance, l2: FastifyInstance, key: string): Promise<void> {
  expect((await putObject(l1, key, '5', 'written by L1')).statusCode).toBe(200);
  expect((await raiseFence(l2, key, '6')).json()).toEqual({ fenceKey: key, highestToken: '6' });
}

/** The refusal L1 must get, the object untouched, and the refusal counted on the fence L1 named. */
async function expectRefused(
  db: TestDatabase,
  res: { statusCode: number; json(): unknown },
  key: string,
  alt: string,
  operation: 'put' | 'delete',
) {
  expect(res.statusCode).toBe(409);
  expect(res.json()).toMatchObject({ error: 'stale_token', fenceKey: key, token: '5', highestToken: '6' });
  expect(await storedObject(db, key)).toEqual({ fence_key: key, token: '5', version: '1', body: 'written by L1' });
  expect(await fenceCounts(db, alt)).toMatchObject({ accepted: '0', rejected: '1' });
  expect(await rejectionsOf(db, key)).toEqual([{ fence_key: alt, operation, token: '5', highest_token: '5' }]);
}

for (const [where, l1, l2] of [
  ['one proxy', 'a', 'a'],
  ['two proxy instances', 'a', 'b'],
] as const) {
  describe(`${where}: a deposed leader cannot step around the object's fence`, () => {
    test("a PUT naming another fence key with a token below the object fence's highest gets 409 and changes nothing", async ({
      db,
      proxies,
    }) => {
      const key = uniq('inv/7');
      const alt = `${key}-alt`;
      await deposeL1(proxies[l1], proxies[l2], key);
      await expectRefused(db, await putObject(proxies[l1], key, '5', 'overwritten by deposed L1', alt), key, alt, 'put');
    });

    test("a DELETE naming another fence key with a token below the object fence's highest gets 409 and the object stays", async ({
      db,
      proxies,
    }) => {
      const key = uniq('inv/7');
      const alt = `${key}-alt`;
      await deposeL1(proxies[l1], proxies[l2], key);
      await expectRefused(db, await deleteObject(proxies[l1], key, '5', alt), key, alt, 'delete');
    });

    test("a token ≥ the object fence's highest may move the object to another fence key, and delete it from there", async ({
      db,
      proxies,
    }) => {
      const key = uniq('inv/7');
      const moved = `${key}-moved`;
      await deposeL1(proxies[l1], proxies[l2], key);
      const res = await putObject(proxies[l2], key, '6', 'moved by L2', moved);
      expect(res.statusCode, res.body).toBe(200);
      expect(res.json()).toMatchObject({ fenceKey: moved, token: '6', version: 2 });
      expect(await storedObject(db, key)).toEqual({ fence_key: moved, token: '6', version: '2', body: 'moved by L2' });
      // Now the object follows fence `moved`: raise it, and the old fence key no longer reaches it.
      expect((await raiseFence(proxies[l2], moved, '9')).statusCode).toBe(200);
      expect((await putObject(proxies[l1], key, '8', 'x', key)).json()).toMatchObject({
        error: 'stale_token',
        fenceKey: moved,
        highestToken: '9',
      });
      expect((await deleteObject(proxies[l2], key, '9', `${key}-other`)).statusCode).toBe(204);
      expect(await storedObject(db, key)).toBeNull();
    });
  });
}

describe("writes racing a change of the object's fence", () => {
  // The check locks the object and reads its fence under a lock: a raise or a move not yet committed
  // is waited for and then counts, whichever proxy (or transaction) makes it.
  for (const operation of ['put', 'delete'] as const) {
    test(`a ${operation.toUpperCase()} naming another fence key waits for a raise of the object's fence in flight, and is refused once it commits`, async ({
      db,
      proxies,
    }) => {
      const key = uniq('inflight');
      const alt = `${key}-alt`;
      expect((await putObject(proxies.a, key, '5', 'written by L1')).statusCode).toBe(200);
      const raise = await db.pool.connect();
      try {
        await raise.query('BEGIN');
        await raise.query('UPDATE fencepost.fences SET highest_token = 6 WHERE fence_key = $1', [key]);
        let settled = false;
        const attack = (
          operation === 'put' ? putObject(proxies.b, key, '5', 'overwritten by deposed L1', alt) : deleteObject(proxies.b, key, '5', alt)
        ).finally(() => (settled = true));
        await new Promise((r) => setTimeout(r, 300));
        expect(settled, 'the attack must wait for the raise in flight').toBe(false);
        await raise.query('COMMIT');
        await expectRefused(db, await attack, key, alt, operation);
      } finally {
        raise.release();
      }
    });
  }

  for (const operation of ['put', 'delete'] as const) {
    test(`a ${operation.toUpperCase()} naming another fence key waits for a move of the object in flight, and is judged against the fence it moved to`, async ({
      db,
      proxies,
    }) => {
      const key = uniq('moving');
      const alt = `${key}-alt`;
      const next = `${key}-next`;
      expect((await putObject(proxies.a, key, '5', 'written by L1')).statusCode).toBe(200);
      // Another session moves the object to fence `next` (highest 50) and has not committed yet.
      const move = await db.pool.connect();
      try {
        await move.query('BEGIN');
        await move.query('INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ($1, 50)', [next]);
        await move.query(`UPDATE fencepost.objects SET fence_key = $2, token = 50, version = version + 1, body = 'moved' WHERE key = $1`, [
          key,
          next,
        ]);
        // Token 10 passes the object's fence as the statement first sees it (inv, highest 5).
        const attack = operation === 'put' ? putObject(proxies.b, key, '10', 'overwritten', alt) : deleteObject(proxies.b, key, '10', alt);
        await new Promise((r) => setTimeout(r, 200));
        await move.query('COMMIT');
        const res = await attack;
        expect(res.statusCode, res.body).toBe(409);
        expect(res.json()).toMatchObject({ error: 'stale_token', fenceKey: next, token: '10', highestToken: '50' });
      } finally {
        move.release();
      }
      expect(await storedObject(db, key)).toEqual({ fence_key: next, token: '50', version: '2', body: 'moved' });
    });
  }

  test("a move waiting on a raise that rolls back goes through with the fence's token", async ({ db, proxies }) => {
    const key = uniq('inflight-rollback');
    expect((await putObject(proxies.a, key, '5', 'written by L1')).statusCode).toBe(200);
    const raise = await db.pool.connect();
    try {
      await raise.query('BEGIN');
      await raise.query('UPDATE fencepost.fences SET highest_token = 6 WHERE fence_key = $1', [key]);
      const move = putObject(proxies.b, key, '5', 'moved', `${key}-alt`);
      await new Promise((r) => setTimeout(r, 100));
      await raise.query('ROLLBACK');
      expect((await move).statusCode).toBe(200);
    } finally {
      raise.release();
    }
    expect(await storedObject(db, key)).toMatchObject({ fence_key: `${key}-alt`, version: '2', body: 'moved' });
  });
});
