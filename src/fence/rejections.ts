// The rejection log (fencepost.rejections): paged reads, a per-minute histogram, and the batched
// deletes retention uses. Every statement is a named builder here; callers never write SQL.
import type pg from 'pg';
import type { Door, OpKind, Query } from './queries.ts';

/** Largest bigint: the `before` cursor of the first page. */
const MAX_ID = '9223372036854775807';

export interface Rejection {
  id: bigint;
  fenceKey: string;
  /** Null for a fence-only advance. */
  objectKey: string | null;
  operation: OpKind | 'transaction';
  /** Where it was refused (migration 0016; SQL-endpoint rejections logged before it read `transaction`). */
  door: Door;
  token: bigint;
  /** The fence's highest token when the write was refused. */
  highestToken: bigint;
  writerId: string | null;
  rejectedAt: Date;
}

export interface RejectionPage {
  rejections: Rejection[];
  /** Pass as `before` for the next (older) page; null at the end. */
  next: bigint | null;
}

export interface HistogramBucket {
  start: Date;
  count: number;
}

const COLUMNS = 'id, fence_key, object_key, operation, door, token, highest_token, writer_id, rejected_at';

/**
 * Newest first, keyset-paged on id. Two statements rather than `$1 IS NULL OR …`, so each keeps
 * a plan that walks its own index backwards (the primary key, or (fence_key, id DESC)).
 */
export function listRejections(fenceKey: string | null, before: bigint | null, limit: number): Query {
  const cursor = before === null ? MAX_ID : before.toString();
  if (fenceKey === null) {
    return {
      name: 'fencepost_list_rejections',
      text: `SELECT ${COLUMNS} FROM fencepost.rejections WHERE id < $1::bigint ORDER BY id DESC LIMIT $2`,
      values: [cursor, limit],
    };
  }
  return {
    name: 'fencepost_list_rejections_by_fence',
    text: `SELECT ${COLUMNS} FROM fencepost.rejections WHERE fence_key = $1 AND id < $2::bigint ORDER BY id DESC LIMIT $3`,
    values: [fenceKey, cursor, limit],
  };
}

/**
 * Rejections per minute for the last `minutes` minutes (the current, partial minute last), with
 * empty minutes as zero. Times are the database's, so every proxy instance answers the same. Over
 * all fences the counts come from rejection_minutes (kept as rejections are recorded: a minute is a
 * few rows, however many rejections); for one fence, from the index (fence_key, rejected_at).
 */
export function rejectionHistogram(minutes: number, fenceKey: string | null): Query {
  const counts =
    fenceKey === null
      ? `SELECT m.minute, sum(m.count)::int AS n FROM fencepost.rejection_minutes m, span WHERE m.minute >= span.first GROUP BY 1`
      : `SELECT date_trunc('minute', r.rejected_at) AS minute, count(*)::int AS n
  FROM fencepost.rejections r, span
  WHERE r.fence_key = $2::text AND r.rejected_at >= span.first
  GROUP BY 1`;
  return {
    name: fenceKey === null ? 'fencepost_rejection_histogram' : 'fencepost_rejection_histogram_by_fence',
    text: `
WITH span AS (
  SELECT date_trunc('minute', now()) - ($1::int - 1) * interval '1 minute' AS first, date_trunc('minute', now()) AS last
),
counts AS (
  ${counts}
)
SELECT m.minute AS start, coalesce(c.n, 0) AS count
FROM span, generate_series(span.first, span.last, interval '1 minute') AS m(minute)
LEFT JOIN counts c ON c.minute = m.minute
ORDER BY m.minute`,
    values: fenceKey === null ? [minutes] : [minutes, fenceKey],
  };
}

/** One proxy instance prunes at a time: the others skip the round (session advisory lock). */
export function tryRetentionLock(key: bigint): Query {
  return { text: 'SELECT pg_try_advisory_lock($1) AS locked', values: [key.toString()] };
}

export function retentionUnlock(key: bigint): Query {
  return { text: 'SELECT pg_advisory_unlock($1)', values: [key.toString()] };
}

/** Per-minute counts older than the histogram's longest window (a day) are never read again. */
export function pruneRejectionMinutes(): Query {
  return {
    name: 'fencepost_prune_rejection_minutes',
    text: `DELETE FROM fencepost.rejection_minutes WHERE minute < now() - interval '25 hours'`,
  };
}

/** Deletes up to `batch` of the oldest rows older than `maxAgeMs`; returns the deleted ids. */
export function pruneRejectionsByAge(maxAgeMs: number, batch: number): Query {
  return {
    name: 'fencepost_prune_rejections_by_age',
    text: `
DELETE FROM fencepost.rejections WHERE id IN (
  SELECT id FROM fencepost.rejections
  WHERE rejected_at < now() - $1::bigint * interval '1 millisecond'
  ORDER BY rejected_at LIMIT $2
)
RETURNING id`,
    values: [maxAgeMs, batch],
  };
}

/**
 * The highest id that must go so at most `maxRows` remain: everything at or below
 * max(id) − maxRows. Ids only grow, so the newest `maxRows` ids survive; gaps in the sequence
 * (rolled-back inserts) only make the log shorter. O(1) on the primary key, unlike OFFSET.
 */
export function rejectionRowCutoff(maxRows: number): Query {
  return {
    name: 'fencepost_rejection_row_cutoff',
    text: `SELECT max(id) - $1::bigint AS cutoff FROM fencepost.rejections`,
    values: [maxRows],
  };
}

/** Deletes up to `batch` of the oldest rows with id ≤ `cutoff`; returns the deleted ids. */
export function pruneRejectionsUpTo(cutoff: bigint, batch: number): Query {
  return {
    name: 'fencepost_prune_rejections_up_to',
    text: `
DELETE FROM fencepost.rejections WHERE id IN (
  SELECT id FROM fencepost.rejections WHERE id <= $1::bigint ORDER BY id LIMIT $2
)
RETURNING id`,
    values: [cutoff.toString(), batch],
  };
}

interface RejectionRow {
  id: string;
  fence_key: string;
  object_key: string | null;
  operation: OpKind | 'transaction';
  door: Door;
  token: string;
  highest_token: string;
  writer_id: string | null;
  rejected_at: Date;
}

/** One page of the log, newest first. */
export async function readRejections(
  pool: pg.Pool,
  opts: { fenceKey: string | null; before: bigint | null; limit: number },
): Promise<RejectionPage> {
  const { rows } = await pool.query<RejectionRow>(listRejections(opts.fenceKey, opts.before, opts.limit + 1));
  const page = rows.slice(0, opts.limit).map((r): Rejection => ({
    id: BigInt(r.id),
    fenceKey: r.fence_key,
    objectKey: r.object_key,
    operation: r.operation,
    door: r.door,
    token: BigInt(r.token),
    highestToken: BigInt(r.highest_token),
    writerId: r.writer_id,
    rejectedAt: r.rejected_at,
  }));
  return { rejections: page, next: rows.length > opts.limit ? (page.at(-1)?.id ?? null) : null };
}

export async function readRejectionHistogram(pool: pg.Pool, minutes: number, fenceKey: string | null): Promise<HistogramBucket[]> {
  const { rows } = await pool.query<{ start: Date; count: number }>(rejectionHistogram(minutes, fenceKey));
  return rows.map((r) => ({ start: r.start, count: r.count }));
}
