// The counters' statements: accepted counts folded into fence_counts and totals, and the ops view's
// totals and per-fence counts.
import type { Query } from './query.ts';
import { shardSql } from '../shards.ts';
import { COUNTS, PENDING } from './fences.ts';

/** The end of a count Query: adds a CTE `per_fence (fence_key, n)` to fence_counts and totals (fold shards). */
const ADD_PER_FENCE_COUNTS = `counted AS (
  INSERT INTO fencepost.fence_counts AS c (fence_key, shard, accepted)
  SELECT fence_key, ${shardSql('fold')}, n FROM per_fence ORDER BY fence_key COLLATE "C"
  ON CONFLICT (fence_key, shard) DO UPDATE SET accepted = c.accepted + EXCLUDED.accepted
)
INSERT INTO fencepost.totals AS t (shard, accepted)
SELECT ${shardSql('fold')}, sum(n) FROM per_fence HAVING count(*) > 0
ON CONFLICT (shard) DO UPDATE SET accepted = t.accepted + EXCLUDED.accepted`;

/** Adds accepted counts (accepted-counts.ts) to the counters, in the fold shards (shards.ts). */
export function addAcceptedCounts(fenceKeys: readonly string[], counts: readonly number[]): Query {
  return {
    text: `
WITH local_commit AS (
  -- A count, not a fence: its commit need not wait for a synchronous standby (which may be down).
  SELECT pg_catalog.set_config('synchronous_commit', 'local', true) AS s
),
per_fence AS (
  SELECT t.fence_key, t.n FROM unnest($1::text[], $2::bigint[]) AS t(fence_key, n), local_commit
),
${ADD_PER_FENCE_COUNTS}`,
    values: [fenceKeys, counts.map(String)],
  };
}

export function foldPendingCounts(): Query {
  return {
    // Unnamed, so planned at each run: a plan cached while the table was empty re-ran the locking
    // subquery for every row (quadratic; 10,000 rows took 5 s). Once a second, planning is cheap.
    text: `
WITH done AS (
  DELETE FROM fencepost.pending_counts s
  WHERE s.ctid IN (SELECT t.ctid FROM fencepost.pending_counts t LIMIT 100000 FOR UPDATE SKIP LOCKED)
  RETURNING s.fence_key
),
per_fence AS (
  SELECT fence_key, count(*) AS n FROM done GROUP BY fence_key
),
${ADD_PER_FENCE_COUNTS}`,
  };
}

/**
 * Totals kept as writes commit (migration 0005): a row per shard, whatever the number of fences,
 * plus the committed transactions not folded yet.
 */
export function statsTotals(): Query {
  return {
    name: 'fencepost_stats_totals',
    text: `SELECT coalesce(sum(fences), 0)::bigint AS fences,
  (coalesce(sum(accepted), 0) + (SELECT count(*) FROM fencepost.pending_counts))::bigint AS accepted,
  coalesce(sum(rejected), 0)::bigint AS rejected
FROM fencepost.totals`,
  };
}

/**
 * Per-fence counts for the ops view: the fences rejected most recently (up to `limit` of them,
 * found by walking the rejection log backwards), most rejected first; then the most recently
 * raised fences, up to `limit` in all. Both lists come from indexes (rejections' primary key,
 * fences_updated_at) and count at most `limit` fences, so the cost does not grow with the tables.
 */
export function statsPerFence(limit: number): Query {
  return {
    name: 'fencepost_stats_per_fence',
    text: `
WITH rejected_keys AS (
  SELECT fence_key FROM (SELECT fence_key, id FROM fencepost.rejections ORDER BY id DESC LIMIT 20 * $1) r
  GROUP BY fence_key ORDER BY max(id) DESC LIMIT $1
),
raised_keys AS (
  SELECT f.fence_key FROM fencepost.fences f
  WHERE NOT EXISTS (SELECT 1 FROM rejected_keys r WHERE r.fence_key = f.fence_key)
  ORDER BY f.updated_at DESC
  LIMIT $1
),
picked AS (
  SELECT fence_key, 0 AS part FROM rejected_keys UNION ALL SELECT fence_key, 1 FROM raised_keys
)
SELECT f.fence_key, f.highest_token, f.raised_by, f.updated_at, ${COUNTS}
FROM picked pk JOIN fencepost.fences f ON f.fence_key = pk.fence_key ${PENDING}
ORDER BY pk.part, rejected DESC, accepted DESC, f.fence_key COLLATE "C"
LIMIT $1`,
    values: [limit],
  };
}
