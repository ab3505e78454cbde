// Who holds a fence row that a raise could not lock in time, when it is a prepared transaction.
// Client SQL cannot PREPARE a /v1/transactions transaction (it reads a temporary sequence, rule.ts
// NO_PREPARE_READ), but one made straight on Postgres (an operator, an older proxy) can hold a
// fence row for ever: no lock timeout of a raise ends it, only COMMIT PREPARED or ROLLBACK
// PREPARED does. A 55P03 then names it, so the answer says what to run instead of "safe to retry".
import pg from 'pg';
import * as q from './sql/transactions.ts';
import { LOCK_NOT_AVAILABLE } from './sqlstate.ts';
import { FenceHeldByPreparedError, type PreparedHolder } from './errors.ts';

export type { PreparedHolder } from './errors.ts';

/**
 * The first prepared transaction found holding one of these fence rows, or null. The row's xmax is
 * the locker's xid for a single locker; for several (share locks) a MultiXactId, whose members
 * pg_get_multixact_members lists. Never throws: a lookup that fails finds nothing.
 */
export async function preparedHolder(pool: pg.Pool, fenceKeys: readonly string[]): Promise<PreparedHolder | null> {
  try {
    const { rows } = await pool.query<{ fence_key: string; gid: string | null; xmax: string; direct: boolean }>(
      q.preparedFenceHolders(fenceKeys),
    );
    const direct = rows.find((r) => r.gid !== null);
    if (direct) return { fenceKey: direct.fence_key, gid: direct.gid! };
    for (const r of rows) {
      // Not a prepared transaction's own xid: maybe several lockers, a MultiXactId (or else the
      // lookup fails or lists none).
      const multi = await pool.query<{ gid: string }>(q.preparedMultiXactHolders(r.xmax)).catch(() => null);
      const gid = multi?.rows[0]?.gid;
      if (gid !== undefined) return { fenceKey: r.fence_key, gid };
    }
  } catch {
    // The answer stays the lock timeout's own.
  }
  return null;
}

/** `err` itself, or a FenceHeldByPreparedError when it is a lock timeout and a prepared transaction holds one of the fence rows. */
export async function explainLockTimeout(pool: pg.Pool, fenceKeys: readonly string[], err: unknown): Promise<unknown> {
  if ((err as { code?: unknown } | null)?.code !== LOCK_NOT_AVAILABLE || err instanceof FenceHeldByPreparedError) return err;
  const holder = await preparedHolder(pool, fenceKeys);
  return holder === null ? err : new FenceHeldByPreparedError(holder, err);
}
