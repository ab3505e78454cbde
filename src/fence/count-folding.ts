// Folding the count rows of committed writes and transactions (the leaner puts, the SQL endpoint,
// POST /v1/transactions; pending_counts, migration 0012) into the counters (q.foldPendingCounts).
// The count reads add what is not folded yet, so folding only keeps pending_counts short.
import type pg from 'pg';
import * as q from './sql/counts.ts';

/** How often each proxy folds committed transactions into the counters (reads add the rest). */
const FOLD_INTERVAL_MS = 1000;

export async function foldPendingCounts(pool: pg.Pool): Promise<void> {
  await pool.query(q.foldPendingCounts());
}

/** Folds every FOLD_INTERVAL_MS, one fold at a time, until stopped (the returned function). */
export function startFolding(pool: pg.Pool, onError: (err: unknown) => void): () => void {
  let timer: NodeJS.Timeout | null = null;
  let stopped = false;
  const tick = () => {
    foldPendingCounts(pool)
      .catch(onError)
      .finally(() => {
        if (!stopped) (timer = setTimeout(tick, FOLD_INTERVAL_MS)).unref();
      });
  };
  (timer = setTimeout(tick, FOLD_INTERVAL_MS)).unref();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}
