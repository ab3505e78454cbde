// The raise of a fence to a new leader's token, in a transaction of the proxy's own: the SQL doors
// never raise inside a writer's transaction (definitions.ts fence_session reports a fence below
// the token; the proxy raises here and fences again), and the HTTP door comes here when its
// own write statement found the fence held. So a raise commits with synchronous_commit on whatever
// the writer's login, role or session set, and holds the fence row only for its own statement.
//
// A raise never waits on a zombie: what holds the fence row with an older token (a transaction of
// a paused writer, an idle one, a sleeping one that lifted its own timeouts, a prepared
// transaction) is waited for `waitMs`, then ended on the database side — the backends blocking the
// raise terminated, prepared transactions holding the fence rolled back — and the raise commits.
// Their uncommitted writes roll back; the new leader wins in bounded time. Only what blocks this
// very raise is ended: a fence row is held only by transactions at its current token, below the
// raise's (a transaction at the raise's own token cannot hold it before the raise commits); the
// proxy's own role's backends (other raises, the HTTP door's statements, short and under the lock
// timeout) are left alone.
//
// Every raise, this one and any other, also ends the SQL doors' connections fenced at an older
// token of the fence (the trigger fences_revoke_older, definitions.ts revoke_older_sessions), in
// its own transaction, before it commits.
import type pg from 'pg';
import {
  beginRaise,
  fenceHolders,
  raiseFencesQuery,
  readHighestTokenAfterRaise,
  rollbackPreparedHolder,
  terminateHolder,
} from './sql/fences.ts';
import { readHighestToken } from './reads.ts';
import { explainLockTimeout } from './prepared-holders.ts';
import { watchCommit } from './commit-outcome.ts';
import { coerceError, isLostAfterSend, sqlState } from './pg-errors.ts';
import { LOCK_NOT_AVAILABLE } from './sqlstate.ts';
import { withClient, type Checkout } from './checkout.ts';
import { WriteOutcomeUnknownError } from './errors.ts';

export interface RaisedFence {
  fenceKey: string;
  /** The fence's highest token after the raise: the token itself, or above it (stale); null when a raise above it won meanwhile. */
  highestToken: bigint | null;
}

/** Where a raise says what it ended (a pino or fastify logger). */
export interface RaiseLogger {
  warn(obj: object, msg: string): void;
}

export interface RaiseOptions {
  /** How long the raise waits for older tokens' transactions before it ends them. */
  waitMs: number;
  /** The raise fails (55P03) if the fence is still held this long after the holders were ended. */
  lockTimeoutMs: number;
  logger?: RaiseLogger;
}

/** What a raise ended to get through. */
export interface EndedHolder {
  kind: 'backend' | 'prepared';
  /** Backend pid, or the prepared transaction's gid. */
  id: string;
  role: string;
}

const END_POLL_MS = 100;

/**
 * Raises each fence to its token where it is absent or below; returns each fence's highest token
 * after. A COMMIT sent and not confirmed (connection lost, the pool's query timeout, a wait for the
 * synchronous standby cancelled) rejects with a WriteOutcomeUnknownError: the raise may have
 * committed. Any other failure committed nothing.
 */
export async function raiseFences(
  pool: pg.Pool,
  fences: readonly { fenceKey: string; token: bigint }[],
  writerId: string | null,
  opts: RaiseOptions,
): Promise<RaisedFence[]> {
  let ender: Promise<void> = Promise.resolve();
  try {
    return await withClient(pool, (client, checkout) => raiseOn(client, checkout));
  } finally {
    await ender;
  }

  async function raiseOn(client: pg.PoolClient, checkout: Checkout): Promise<RaisedFence[]> {
    let open = false;
    let done = false;
    try {
      const pid = (client as unknown as { processID: number }).processID;
      // The wait for the holders, then the wait for them to go: a raise never takes longer than both.
      // Then the raise's trigger ends the older-token connections of the fence after the same wait
      // (definitions.ts revoke_older_sessions), and 500 ms for them to exit.
      const waitMs = Math.max(0, Math.trunc(opts.waitMs));
      const lockTimeout = Math.max(1, Math.trunc(opts.waitMs + opts.lockTimeoutMs));
      const statementTimeout = 2 * waitMs + lockTimeout + 5000;
      await client.query(beginRaise({ lockTimeoutMs: lockTimeout, statementTimeoutMs: statementTimeout, waitMs }));
      open = true;
      let finish = () => {};
      const finished = new Promise<void>((resolve) => (finish = resolve));
      const timer = setTimeout(() => {
        ender = endHolders(
          pool,
          pid,
          fences.map((f) => f.fenceKey),
          () => done,
          finished,
          opts.logger,
        );
      }, opts.waitMs);
      let rows: { fence_key: string; highest_token: string | null }[];
      try {
        rows = (await client.query<{ fence_key: string; highest_token: string | null }>(raiseFencesQuery(fences, writerId))).rows;
      } finally {
        done = true;
        finish();
        clearTimeout(timer);
      }
      open = false;
      const commit = watchCommit(client);
      try {
        await client.query('COMMIT');
        commit.check();
      } catch (err) {
        if (!isLostAfterSend(err)) throw err;
        // A client that stopped waiting still has the COMMIT in flight: it must not serve another.
        checkout.discard(coerceError(err));
        throw new WriteOutcomeUnknownError(err, "the raise's COMMIT was sent and not answered: the fence may or may not have been raised");
      } finally {
        commit.stop();
      }
      return rows.map((r) => ({ fenceKey: r.fence_key, highestToken: r.highest_token === null ? null : BigInt(r.highest_token) }));
    } catch (err) {
      if (err instanceof WriteOutcomeUnknownError) throw err;
      if (open) await client.query('ROLLBACK').catch(() => {});
      open = false;
      await ender;
      // Still held (a prepared transaction this role may not roll back, say): name what holds it.
      throw await explainLockTimeout(
        pool,
        fences.map((f) => f.fenceKey),
        err,
      );
    } finally {
      if (open) await client.query('ROLLBACK').catch(() => {});
    }
  }
}

/** Ends what blocks backend `raiser` on `fenceKeys`, again every END_POLL_MS until `finished()`. */
async function endHolders(
  pool: pg.Pool,
  raiser: number,
  fenceKeys: readonly string[],
  finished: () => boolean,
  raised: Promise<void>,
  logger?: RaiseLogger,
): Promise<void> {
  const ended = new Set<string>();
  while (!finished()) {
    try {
      const { rows } = await pool.query<EndedHolder>(fenceHolders(raiser, fenceKeys));
      for (const h of rows) {
        if (finished() || ended.has(`${h.kind}:${h.id}`)) continue;
        ended.add(`${h.kind}:${h.id}`);
        logger?.warn(
          { fenceKeys, holder: h },
          h.kind === 'backend'
            ? 'raise: terminating a backend that holds the fence with an older token'
            : 'raise: rolling back a prepared transaction that holds the fence',
        );
        if (h.kind === 'backend') await pool.query(terminateHolder(Number(h.id)));
        else await pool.query(rollbackPreparedHolder(h.id));
      }
    } catch (err) {
      logger?.warn({ fenceKeys, err: (err as Error).message }, 'raise: could not end a holder of the fence');
    }
    // Again in a while, or not at all once the raise is through (its caller waits for this).
    let wake: NodeJS.Timeout | undefined;
    await Promise.race([raised, new Promise((resolve) => (wake = setTimeout(resolve, END_POLL_MS)))]);
    clearTimeout(wake);
  }
}

/**
 * After a writer's backend was terminated: was it a raise above `token`? The fence's highest token
 * when it is above `token`, else null. With `waitMs` above 0, the fence row is read FOR SHARE under
 * a lock_timeout of `waitMs` (sql/fences.ts readHighestTokenAfterRaise): a raise holds the row from
 * before it ends the older backends until it commits, so the answer comes as soon as that raise
 * commits, and at once when no raise is in flight (an operator's pg_terminate_backend: the writer
 * hears Postgres's words without a wait). A raise still running after `waitMs`: null.
 */
export async function raisedAbove(pool: pg.Pool, fenceKey: string, token: bigint, waitMs: number): Promise<bigint | null> {
  const above = (h: bigint | null) => (h !== null && h > token ? h : null);
  if (waitMs <= 0) return above(await readHighestToken(pool, fenceKey));
  return await withClient(pool, async (client) => {
    await client.query('BEGIN');
    try {
      let rows: { highest_token: string }[] = [];
      for (const q of readHighestTokenAfterRaise(fenceKey, waitMs)) rows = (await client.query<{ highest_token: string }>(q)).rows;
      await client.query('COMMIT');
      return above(rows[0] ? BigInt(rows[0].highest_token) : null);
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {});
      if (sqlState(err) === LOCK_NOT_AVAILABLE) return null;
      throw err;
    }
  });
}
