// The fences' statements: reading fences, the raise, and who holds a fence a raise waits for.
import pg from 'pg';
import type { Query } from './query.ts';
import { shareStep, raiseStep } from './rule.ts';
import { shardSql } from '../shards.ts';
import { prefixEnd } from './objects.ts';

/**
 * A fence's counts: the sum of its counter rows (one per fence and backend shard), plus its
 * committed transactions not folded into them yet (PENDING, joined as `p`: pending_counts,
 * migration 0012). One snapshot sees each such transaction either still pending or folded.
 */
export const COUNTS = `(coalesce((SELECT sum(c.accepted) FROM fencepost.fence_counts c WHERE c.fence_key = f.fence_key), 0) + coalesce(p.n, 0))::bigint AS accepted,
  coalesce((SELECT sum(c.rejected) FROM fencepost.fence_counts c WHERE c.fence_key = f.fence_key), 0)::bigint AS rejected`;
export const PENDING = `LEFT JOIN (SELECT s.fence_key, count(*) AS n FROM fencepost.pending_counts s GROUP BY s.fence_key) p ON p.fence_key = f.fence_key`;

/** A fence's highest token alone (the forgery guard's question, a raise's aftermath): no counts to add up. */
export function readHighestToken(fenceKey: string): Query {
  return {
    name: 'fencepost_read_highest_token',
    text: 'SELECT highest_token FROM fencepost.fences WHERE fence_key = $1',
    values: [fenceKey],
  };
}

/**
 * A fence's highest token, its row shared, in a transaction whose lock_timeout is `waitMs`: a raise
 * in flight holds the row (its UPDATE, whose trigger ends the older backends, until it commits), so
 * this waits for that raise and reads what it committed; with none in flight it answers at once.
 * Two statements, one after the other, in a transaction of the caller's.
 */
export function readHighestTokenAfterRaise(fenceKey: string, waitMs: number): Query[] {
  return [
    { text: "SELECT pg_catalog.set_config('lock_timeout', $1, true)", values: [`${Math.max(1, Math.round(waitMs))}ms`] },
    { text: 'SELECT highest_token FROM fencepost.fences WHERE fence_key = $1 FOR SHARE', values: [fenceKey] },
  ];
}

export function readFence(fenceKey: string): Query {
  return {
    name: 'fencepost_read_fence',
    text: `SELECT f.fence_key, f.highest_token, f.updated_at, f.raised_by, ${COUNTS} FROM fencepost.fences f ${PENDING} WHERE f.fence_key = $1`,
    values: [fenceKey],
  };
}

/**
 * The fence with the highest token among those whose keys start with `prefix` (an election's
 * fences, GET /v1/elections): where its leader's raise shows. Walks fences_key_bytes over the
 * prefix's range.
 */
export function leadingFence(prefix: string): Query {
  const end = prefix === '' ? null : prefixEnd(prefix);
  return {
    name: end === null ? 'fencepost_leading_fence' : 'fencepost_leading_fence_below',
    text: `SELECT fence_key, highest_token, raised_by, updated_at FROM fencepost.fences
WHERE fence_key COLLATE "C" >= $1::text COLLATE "C"${end === null ? '' : ' AND fence_key COLLATE "C" < $2::text COLLATE "C"'}
ORDER BY highest_token DESC, fence_key COLLATE "C" LIMIT 1`,
    values: end === null ? [prefix] : [prefix, end],
  };
}

/**
 * Keyset paging in fence-key order (byte order, so it is stable whatever the collation), walking
 * the index fences_key_bytes from the cursor. Two statements rather than `$1 IS NULL OR …`, so
 * each keeps a plan that starts at its cursor.
 */
export function listFences(after: string | null, limit: number): Query {
  if (after === null) {
    return {
      name: 'fencepost_list_fences_first',
      text: `SELECT f.fence_key, f.highest_token, f.updated_at, f.raised_by, ${COUNTS} FROM (
  SELECT * FROM fencepost.fences ORDER BY fence_key COLLATE "C" LIMIT $1) f ${PENDING} ORDER BY f.fence_key COLLATE "C"`,
      values: [limit],
    };
  }
  return {
    name: 'fencepost_list_fences_after',
    text: `SELECT f.fence_key, f.highest_token, f.updated_at, f.raised_by, ${COUNTS} FROM (
  SELECT * FROM fencepost.fences WHERE fence_key COLLATE "C" > $1::text COLLATE "C" ORDER BY fence_key COLLATE "C" LIMIT $2) f ${PENDING}
ORDER BY f.fence_key COLLATE "C"`,
    values: [after, limit],
  };
}

/**
 * Folds committed writes and transactions into the counters (migration 0012): deletes the rows
 * they left in pending_counts (rows of committed ones only: they commit with them) and adds
 * them to fence_counts and totals, in one statement. Rows another fold holds are skipped, never
 * waited for or counted twice. Counter shards 64–95: no writer's statement or transaction holds
 * them, so a fold never waits for one.
 */
/**
 * The raise of the SQL doors (raise.ts): each fence absent or below its token is inserted or raised
 * to it, in a statement of the proxy's own (its pool forces synchronous_commit on), before the
 * writer's transaction takes the fence at that token. A fence already at or above its token is only
 * read: locked FOR SHARE, as any writer at its token does. Rows: fence_key, highest_token (after).
 */
export function raiseFencesQuery(fences: readonly { fenceKey: string; token: bigint }[], writerId: string | null): Query {
  return {
    name: 'fencepost_raise_fences',
    text: `WITH input AS (
  SELECT t.fence_key, t.token FROM unnest($1::text[], $2::bigint[]) AS t(fence_key, token)
),
held AS (
  ${shareStep('input', '>=')}
),
raised AS (
  ${raiseStep('input', '$3', '<')}
),
created AS (
  INSERT INTO fencepost.totals AS t (shard, fences)
  SELECT ${shardSql('transaction')}, count(*) FROM raised WHERE created HAVING count(*) > 0
  ON CONFLICT (shard) DO UPDATE SET fences = t.fences + EXCLUDED.fences
)
SELECT i.fence_key, coalesce(h.highest_token, r.highest_token)::text AS highest_token
FROM input i LEFT JOIN held h ON h.fence_key = i.fence_key LEFT JOIN raised r ON r.fence_key = i.fence_key`,
    values: [fences.map((f) => f.fenceKey), fences.map((f) => f.token.toString()), writerId],
  };
}

/**
 * What holds `fenceKeys` against a raise by backend `raiser`: the backends blocking it, and
 * prepared transactions holding a fence row. The proxy's own role's backends are left alone (other
 * raises, maybe at this very token; statements short and under the lock timeout), known by their
 * login role (`usename`), which nothing a client sets changes.
 */
export function fenceHolders(raiser: number, fenceKeys: readonly string[]): Query {
  return {
    name: 'fencepost_fence_holders',
    text: `SELECT 'backend' AS kind, b.pid::text AS id, a.usename::text AS role FROM unnest(pg_blocking_pids($1)) AS b(pid)
  JOIN pg_stat_activity a ON a.pid = b.pid WHERE b.pid <> 0 AND a.usename IS DISTINCT FROM current_user
UNION
SELECT 'prepared', p.gid, p.owner::text FROM fencepost.fences f JOIN pg_prepared_xacts p ON p.transaction = f.xmax AND p.database = current_database()
  WHERE f.fence_key = ANY($2::text[]) AND 0 = ANY(pg_blocking_pids($1))`,
    values: [raiser, fenceKeys],
  };
}

/** The application_name of a raise's transaction: a label for operators, never a pass (a client can name itself anything). */
export const RAISE_APPLICATION = 'fencepost-raise';

/**
 * The raise's transaction: READ COMMITTED (each statement sees the holders the wait let go),
 * synchronous_commit on whatever the database's default, the lock and statement timeouts, and the
 * wait the trigger gives older connections (definitions.ts revoke_older_sessions).
 */
export function beginRaise(t: { lockTimeoutMs: number; statementTimeoutMs: number; waitMs: number }): string {
  return `BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = on; SET LOCAL lock_timeout = ${t.lockTimeoutMs}; SET LOCAL statement_timeout = ${t.statementTimeoutMs}; SET LOCAL fencepost.raise_wait_ms = ${t.waitMs}; SET LOCAL application_name = '${RAISE_APPLICATION}'`;
}

/** Ends a backend that holds a fence row with an older token (fenceHolders). */
export function terminateHolder(pid: number): Query {
  return { text: 'SELECT pg_terminate_backend($1)', values: [pid] };
}

/** Rolls back a prepared transaction that holds a fence row (fenceHolders); its gid quoted as a literal. */
export function rollbackPreparedHolder(gid: string): string {
  return `ROLLBACK PREPARED ${pg.escapeLiteral(gid)}`;
}
