// The rejection log's statements: recording refused writes (counts and log rows), paged reads, the
// per-minute histogram, and the batched deletes retention uses.
import type { Query } from './query.ts';
import type { OpKind } from './objects.ts';
import { shardSql } from '../shards.ts';

/** This backend's counter row for rejections (shards.ts). */
const SHARD = shardSql('write');

/** Where a rejection was refused: HTTP object writes and fences, POST /v1/transactions, the SQL endpoint. */
export type Door = 'http' | 'transaction' | 'sql';

export interface RejectionRow {
  /** `transaction` for a refused transaction, of POST /v1/transactions or the SQL endpoint (one row per stale fence). */
  kind: OpKind | 'transaction';
  fenceKey: string;
  key: string | null;
  token: bigint;
  writerId: string | null;
}

/**
 * Records operations rejected at `door`: counts them (per fence, in the totals, per minute), logs
 * each one, and returns each fence's highest token as it is now (read after the rejection, as the
 * 409 reports).
 */
export function recordRejections(door: Door, rows: readonly RejectionRow[]): Query {
  return {
    name: 'fencepost_record_rejections',
    text: `
WITH input AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])
    AS t(operation, fence_key, key, token, writer_id)
),
counts AS (
  SELECT fence_key, count(*) AS n FROM input GROUP BY fence_key
),
bump AS (
  INSERT INTO fencepost.fence_counts AS c (fence_key, shard, rejected)
  SELECT fence_key, ${SHARD}, n FROM counts ORDER BY fence_key COLLATE "C"
  ON CONFLICT (fence_key, shard) DO UPDATE SET rejected = c.rejected + EXCLUDED.rejected
),
total AS (
  INSERT INTO fencepost.totals AS t (shard, rejected) SELECT ${SHARD}, sum(n) FROM counts
  ON CONFLICT (shard) DO UPDATE SET rejected = t.rejected + EXCLUDED.rejected
),
per_minute AS (
  INSERT INTO fencepost.rejection_minutes AS m (minute, shard, count) SELECT date_trunc('minute', now()), ${SHARD}, sum(n) FROM counts
  ON CONFLICT (minute, shard) DO UPDATE SET count = m.count + EXCLUDED.count
),
cur AS (
  SELECT f.fence_key, f.highest_token FROM fencepost.fences f JOIN counts c USING (fence_key)
),
log AS (
  INSERT INTO fencepost.rejections (fence_key, object_key, operation, token, highest_token, writer_id, door)
  SELECT i.fence_key, i.key, i.operation, i.token, cur.highest_token, i.writer_id, $6::text
  FROM input i JOIN cur USING (fence_key)
)
SELECT fence_key, highest_token FROM cur`,
    values: [
      rows.map((r) => r.kind),
      rows.map((r) => r.fenceKey),
      rows.map((r) => r.key),
      rows.map((r) => r.token.toString()),
      rows.map((r) => r.writerId),
      door,
    ],
  };
}

/** Largest bigint: the `before` cursor of the first page. */
const MAX_ID = '9223372036854775807';

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
