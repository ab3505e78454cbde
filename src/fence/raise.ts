// The raise of the SQL doors: a transaction at a token above its fence (a new leader's first) is
// refused by the fence function with RAISE_FIRST (definitions.ts fence_transaction), and the
// proxy raises the fence here, in a transaction of its own on its own pool, then starts the
// transaction again. So a raise commits with synchronous_commit on whatever the writer's login,
// role or session set, and holds the fence row only for its own statement, never for the length
// of a writer's transaction (another session of the same leader starting meanwhile is not stalled).
import type pg from 'pg';
import { raiseFences as raiseFencesQuery } from './queries.ts';
import { explainLockTimeout } from './prepared-holders.ts';

export interface RaisedFence {
  fenceKey: string;
  /** The fence's highest token after the raise: the token itself, or above it (stale); null when a raise above it won meanwhile. */
  highestToken: bigint | null;
}

/**
 * Raises each fence to its token where it is absent or below, waiting at most `lockTimeoutMs` for
 * the transactions that hold it (55P03 after that; a FenceHeldByPreparedError, still 55P03, when
 * a prepared transaction holds it: no wait would end that one).
 */
export async function raiseFences(pool: pg.Pool, fences: readonly { fenceKey: string; token: bigint }[], writerId: string | null, opts: { lockTimeoutMs: number }): Promise<RaisedFence[]> {
  const client = await pool.connect();
  let open = false;
  let released = false;
  try {
    await client.query(`BEGIN; SET LOCAL synchronous_commit = on; SET LOCAL lock_timeout = ${Math.max(1, Math.trunc(opts.lockTimeoutMs))}`);
    open = true;
    const { rows } = await client.query<{ fence_key: string; highest_token: string | null }>(raiseFencesQuery(fences, writerId));
    await client.query('COMMIT');
    open = false;
    return rows.map((r) => ({ fenceKey: r.fence_key, highestToken: r.highest_token === null ? null : BigInt(r.highest_token) }));
  } catch (err) {
    if (open) await client.query('ROLLBACK').catch(() => {});
    open = false;
    client.release();
    released = true;
    throw await explainLockTimeout(pool, fences.map((f) => f.fenceKey), err);
  } finally {
    if (open) await client.query('ROLLBACK').catch(() => {});
    if (!released) client.release();
  }
}
