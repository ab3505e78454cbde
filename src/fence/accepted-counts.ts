// Accepted counts of the SQL doors (the SQL endpoint, POST /v1/transactions), kept by each proxy
// and added to the counters in batches: a committed transaction costs Postgres nothing for its
// count. Each proxy adds its per-fence-key sums every FLUSH_INTERVAL_MS into the fold shards of
// fence_counts and totals (shards.ts), where every count read finds them; this proxy's reads flush
// first (flush()), so what it reports includes every transaction it saw commit. A flush that fails
// keeps its counts for the next one; counts not flushed when the process dies are lost (a count,
// never a write).
import type pg from 'pg';
import * as q from './sql/counts.ts';

/** How often each proxy adds its accepted counts to the counters. */
export const FLUSH_INTERVAL_MS = 2000;
/** How long one flush may take before its connection is dropped (its counts are kept for the next one). */
const FLUSH_TIMEOUT_MS = 5000;

export class AcceptedCounts {
  private pending = new Map<string, number>();
  private flushing: Promise<void> = Promise.resolve();
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly pool: pg.Pool) {}

  /** A transaction under these fence keys committed. */
  add(fenceKeys: Iterable<string>): void {
    for (const k of fenceKeys) this.addOne(k);
  }

  /** A transaction under this fence key committed. */
  addOne(fenceKey: string): void {
    this.pending.set(fenceKey, (this.pending.get(fenceKey) ?? 0) + 1);
  }

  /** Transactions counted here and not yet in the counters (non-zero after a failed flush, or between flushes). */
  get unflushed(): number {
    let n = 0;
    for (const v of this.pending.values()) n += v;
    return n;
  }

  /** Adds what is counted so far to the counters; resolves once it (and any flush before it) is done. */
  flush(): Promise<void> {
    const run = this.flushing.then(async () => {
      if (this.pending.size === 0) return;
      const batch = this.pending;
      this.pending = new Map();
      try {
        // Bounded: a connection that went silent must not hold a shutdown (pool.end waits for it).
        await this.pool.query({
          ...q.addAcceptedCounts([...batch.keys()], [...batch.values()]),
          query_timeout: FLUSH_TIMEOUT_MS,
        } as pg.QueryConfig);
      } catch (err) {
        for (const [k, n] of batch) this.pending.set(k, (this.pending.get(k) ?? 0) + n);
        throw err;
      }
    });
    this.flushing = run.catch(() => {});
    return run;
  }

  /** Flushes every FLUSH_INTERVAL_MS until stop(). */
  start(onError: (err: unknown) => void): void {
    if (this.timer !== null) return;
    const tick = () => {
      this.flush()
        .catch(onError)
        .finally(() => {
          if (this.timer !== null) (this.timer = setTimeout(tick, FLUSH_INTERVAL_MS)).unref();
        });
    };
    (this.timer = setTimeout(tick, FLUSH_INTERVAL_MS)).unref();
  }

  /**
   * Stops the timer and flushes what is left, waiting at most `waitMs` (a database that does not
   * answer loses the counts, never the shutdown).
   */
  async stop(waitMs = 2000): Promise<void> {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<void>((resolve) => (timer = setTimeout(resolve, waitMs)));
    try {
      await Promise.race([this.flush(), late]);
    } finally {
      clearTimeout(timer);
    }
  }
}
