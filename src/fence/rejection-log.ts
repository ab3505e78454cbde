// Recording rejections, the same way for every door: HTTP object writes and fences (the store),
// POST /v1/transactions (transaction.ts) and the SQL endpoint (proxy/sql/listener.ts). One statement
// counts each rejection on its fence, in the totals and per minute, and logs it with its door
// (sql/rejections.ts recordRejections); a deadlock or serialization failure runs it again, `retries`
// times. A recording that still fails is logged here, at warn with the door (the first of a window;
// repeats are counted into one line: src/logging/repeat-limiter.ts), and told to whoever
// watches (onUnrecorded: the proxy's fencepost_rejections_unrecorded_total): the database counts
// miss it, so /metrics says how many.
// Reading and pruning the log: rejections.ts, retention.ts.
import type pg from 'pg';
import type { Logger } from 'pino';
import * as q from './sql/rejections.ts';
import type { Door, RejectionRow } from './sql/rejections.ts';
import { retryOnConflict, STATEMENT_BACKOFF_MS } from './retry.ts';
import { RepeatLimiter } from '../logging/repeat-limiter.ts';

export type { Door, RejectionRow };

export interface RejectionLogOptions {
  /** Extra attempts after a deadlock or serialization failure: the store's (STORE_DEFAULTS.retries). */
  retries: number;
  /** Where a recording that failed is reported; absent: nowhere. */
  logger?: Logger;
  /** Repeats of a failure within this are counted into one line. */
  logRepeatWindowMs: number;
}

/** Told of rejections that could not be recorded: their door and how many. */
export type UnrecordedListener = (door: Door, count: number) => void;

export class RejectionLog {
  private readonly unrecorded = new Set<UnrecordedListener>();
  private readonly failures: RepeatLimiter;

  constructor(
    private readonly pool: pg.Pool,
    private readonly opts: RejectionLogOptions,
  ) {
    this.failures = new RepeatLimiter(opts.logger ?? null, { windowMs: opts.logRepeatWindowMs, maxKinds: 16 });
  }

  /** Calls `listener` for each recording that fails; returns the function that stops it. */
  onUnrecorded(listener: UnrecordedListener): () => void {
    this.unrecorded.add(listener);
    return () => this.unrecorded.delete(listener);
  }

  /**
   * Records `rows`, refused at `door`; resolves to each fence's highest token, read after the
   * rejection. A failure is logged, then thrown: the door answers with it.
   */
  async record(door: Door, rows: readonly RejectionRow[]): Promise<Map<string, bigint>> {
    let result: pg.QueryResult<{ fence_key: string; highest_token: string }>;
    try {
      result = await retryOnConflict(() => this.pool.query<{ fence_key: string; highest_token: string }>(q.recordRejections(door, rows)), {
        retries: this.opts.retries,
        backoffMs: STATEMENT_BACKOFF_MS,
      });
    } catch (err) {
      for (const listener of this.unrecorded) listener(door, rows.length);
      const code = (err as { code?: unknown }).code;
      this.failures.log('warn', `${door}:${typeof code === 'string' ? code : ''}`, { door }, err, 'could not record a rejection', {
        fenceKeys: [...new Set(rows.map((r) => r.fenceKey))].slice(0, 10),
        rejections: rows.length,
      });
      throw err;
    }
    return new Map(result.rows.map((r) => [r.fence_key, BigInt(r.highest_token)]));
  }

  /** Records without the caller waiting, for a door that has answered already: a failure is logged (record), never thrown. */
  recordInBackground(door: Door, rows: readonly RejectionRow[]): void {
    void this.record(door, rows).catch(() => {});
  }
}
