// Bounded retention for the rejection log: rows older than `maxAgeMs` and rows beyond the newest
// `maxRows` are deleted every `intervalMs`, in batches, by one proxy instance at a time (a
// session advisory lock; the others skip that round). Only fencepost.rejections is touched:
// fence rows are never deleted, since deleting one would let a stale token in again.
import type pg from 'pg';
import type { Logger } from 'pino';
import { coerceError } from './pg-errors.ts';
import {
  pruneRejectionMinutes,
  pruneRejectionsByAge,
  pruneRejectionsUpTo,
  rejectionRowCutoff,
  retentionUnlock,
  tryRetentionLock,
} from './sql/rejections.ts';
import { withClient } from './checkout.ts';

// Arbitrary constant, distinct from the migration lock: "fencepost retention".
export const RETENTION_LOCK_KEY = 4_669_143_214_093_121n;

export interface RetentionOptions {
  /** Delete rejections older than this; 0 = no age limit. */
  maxAgeMs: number;
  /** Keep at most this many rejections (the newest); 0 = no row limit. */
  maxRows: number;
  /** Time between prune rounds. */
  intervalMs: number;
  /** Rows per DELETE statement, so no statement holds locks for long. Default 5000. */
  batchSize?: number;
  logger?: Logger;
  /** Called after each round that deleted rows, for metrics. */
  onPruned?: (rows: number) => void;
}

export type PruneResult = { ran: true; deleted: number } | { ran: false; reason: 'locked' | 'disabled' };

export class RejectionPruner {
  private readonly pool: pg.Pool;
  private readonly opts: Required<Omit<RetentionOptions, 'logger' | 'onPruned'>> & Pick<RetentionOptions, 'logger' | 'onPruned'>;
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<unknown> | null = null;
  private stopped = false;

  constructor(pool: pg.Pool, opts: RetentionOptions) {
    this.pool = pool;
    this.opts = { batchSize: 5000, ...opts };
  }

  /** Prunes now, then every `intervalMs` until stop(). */
  start(): void {
    if (this.stopped || this.timer !== null || this.running !== null) return;
    const round = () => {
      this.timer = null;
      this.running = this.pruneOnce()
        .catch((err: unknown) => this.opts.logger?.warn({ err: coerceError(err) }, 'rejection log prune failed; retrying next round'))
        .finally(() => {
          this.running = null;
          if (!this.stopped) {
            this.timer = setTimeout(round, this.opts.intervalMs);
            this.timer.unref();
          }
        });
    };
    round();
  }

  /** Stops the schedule and waits for a round in progress (it stops between batches). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    await this.running;
  }

  /** One round: skipped when another instance holds the lock. */
  async pruneOnce(): Promise<PruneResult> {
    const { maxAgeMs, maxRows, batchSize } = this.opts;
    if (maxAgeMs === 0 && maxRows === 0) return { ran: false, reason: 'disabled' };
    // On any failure the connection is closed rather than pooled: a session advisory lock that
    // could not be released would otherwise stay held, and every later round would skip.
    return await withClient(this.pool, async (client, checkout) => {
      try {
        const { rows } = await client.query<{ locked: boolean }>(tryRetentionLock(RETENTION_LOCK_KEY));
        if (!rows[0]?.locked) return { ran: false, reason: 'locked' } as const;
        let deleted = 0;
        try {
          if (maxAgeMs > 0) deleted += await this.batches(client, () => pruneRejectionsByAge(maxAgeMs, batchSize));
          if (maxRows > 0) {
            const cut = await client.query<{ cutoff: string | null }>(rejectionRowCutoff(maxRows));
            const cutoff = cut.rows[0]?.cutoff;
            if (cutoff != null && BigInt(cutoff) > 0n)
              deleted += await this.batches(client, () => pruneRejectionsUpTo(BigInt(cutoff), batchSize));
          }
          await client.query(pruneRejectionMinutes());
        } finally {
          await client.query(retentionUnlock(RETENTION_LOCK_KEY));
        }
        if (deleted > 0) {
          this.opts.logger?.info({ deleted, maxAgeMs, maxRows }, 'rejection log pruned');
          this.opts.onPruned?.(deleted);
        }
        return { ran: true, deleted } as const;
      } catch (err) {
        checkout.discard(err);
        throw err;
      }
    });
  }

  /** Runs the delete until a batch comes back short, or stop() is called. */
  private async batches(client: pg.PoolClient, query: () => ReturnType<typeof pruneRejectionsByAge>): Promise<number> {
    let total = 0;
    for (;;) {
      const { rowCount } = await client.query(query());
      total += rowCount ?? 0;
      if ((rowCount ?? 0) < this.opts.batchSize || this.stopped) return total;
    }
  }
}
