// The counter-shard map. Counter rows (fence_counts, totals, rejection_minutes) are striped by
// backend, so concurrent statements rarely share one (migration 0005). Each kind of writer counts
// in a range of its own, so one never waits for another's counter rows:
//   0–31   object writes and rejections (fencedWrite, recordRejections)
//   32–63  fences created by the SQL doors' raise (raise.ts, a transaction of the proxy's own)
//   64–95  folds of pending_counts (foldPendingCounts): no writer's statement or transaction holds them
// Readers sum every shard.
export const SHARDS_PER_RANGE = 32;

const FIRST_SHARD = { write: 0, transaction: 32, fold: 64 } as const;

export type ShardRange = keyof typeof FIRST_SHARD;

/** This backend's counter shard in `range`, as an SQL smallint expression. */
export function shardSql(range: ShardRange): string {
  const first = FIRST_SHARD[range];
  return first === 0
    ? `(pg_backend_pid() % ${SHARDS_PER_RANGE})::smallint`
    : `(${first} + pg_backend_pid() % ${SHARDS_PER_RANGE})::smallint`;
}
