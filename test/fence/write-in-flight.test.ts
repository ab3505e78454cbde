// An HTTP object write holds its fence row in share mode until it commits, so a raise waits for it
// and no write of the older token commits after the raise (src/fence/sql/objects.ts: `held` locks the
// fence rows FOR SHARE before the object is written, in fencedWrite and in fencedPuts alike).
// Shown without timing: another session keeps the write in flight by holding the object's row (the
// write takes the fence first, then waits for the object), and pg_blocking_pids / pg_locks say who
// waits on whom. See shared-lock.test.ts for holders that are not HTTP writes.
import { expect } from 'vitest';
import pg from 'pg';
import { fencedPuts, fencedWrite } from '../../src/fence/sql/objects.ts';
import { twoProxiesTest as test } from '../support/fixtures.ts';
import { backendPid, pollUntil, settled, waitersOn, waitsOnRowOf } from '../support/locks.ts';
import { putObject, raiseFence, storedObject } from '../support/objects.ts';

const T = 5;

// Which statement carries the write in flight: A has no hint for the fence (B wrote it), or A's
// own write at T left it a hint (the leader's steady case).
for (const [statement, seededThroughA] of [
  [fencedWrite([]).name, false],
  [fencedPuts([]).name, true],
] as const) {
  test(`a raise waits for an HTTP write at the older token in flight (${statement}); the write commits first, and the old token is stale after`, async ({
    db,
    proxies: { a, b, statementsOfA },
  }) => {
    // Invariant: once a raise to T+1 has answered 200, no write at T can commit; a write at T
    // already holding the fence is waited for, not overtaken.
    const fenceKey = `inflight/${statement}`;
    const key = `${fenceKey}/1`;
    expect((await putObject(seededThroughA ? a : b, key, T, 'seeded at T', fenceKey)).statusCode).toBe(200);

    const blocker = new pg.Client({ connectionString: db.url });
    await blocker.connect();
    const blockerPid = await backendPid(blocker);
    try {
      await blocker.query('BEGIN');
      await blocker.query('SELECT 1 FROM fencepost.objects WHERE key = $1 FOR UPDATE', [key]);

      statementsOfA.length = 0;
      const write = putObject(a, key, T, 'in flight at T', fenceKey);
      const writeState = settled(write);
      const writePid = await pollUntil(
        'the write at T waits for the session holding its object',
        async () => (await waitersOn(db.pool, blockerPid))[0],
        () => (writeState.done ? 'it completed without waiting' : null),
      );
      expect(statementsOfA, 'the write in flight is the statement this case is about').toEqual([statement]);

      const raise = raiseFence(b, fenceKey, T + 1);
      const raiseState = settled(raise);
      const raisePid = await pollUntil(
        'the raise to T+1 waits on the fence row the write at T holds',
        async () => {
          for (const pid of await waitersOn(db.pool, writePid)) if (await waitsOnRowOf(db.pool, pid, 'fencepost.fences')) return pid;
          return undefined;
        },
        () => (raiseState.done ? 'the raise completed while a write of the older token was in flight' : null),
      );
      expect(raisePid).not.toBe(writePid);
      expect([writeState.done, raiseState.done], 'both still in flight').toEqual([false, false]);

      await blocker.query('ROLLBACK');
      const written = await write;
      expect(written.statusCode, written.body).toBe(200);
      const raised = await raise;
      expect(raised.statusCode, raised.body).toBe(200);
      expect(raised.json()).toEqual({ fenceKey, highestToken: String(T + 1) });
    } finally {
      await blocker.end();
    }

    // The write at T committed before the raise; after it, T is stale through either proxy.
    expect(await storedObject(db, key)).toEqual({ fence_key: fenceKey, token: String(T), version: '2', body: 'in flight at T' });
    for (const app of [a, b]) {
      const stale = await putObject(app, key, T, 'after the raise', fenceKey);
      expect(stale.statusCode, stale.body).toBe(409);
      expect(stale.json()).toMatchObject({ error: 'stale_token', highestToken: String(T + 1) });
    }
    expect(await storedObject(db, key)).toMatchObject({ token: String(T), version: '2', body: 'in flight at T' });
  });
}
