// The rejection log (fencepost.rejections): paged reads and a per-minute histogram (statements:
// sql/rejections.ts).
import type pg from 'pg';
import * as q from './sql/rejections.ts';
import type { Door } from './sql/rejections.ts';
import type { OpKind } from './sql/objects.ts';

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

/** A row of the log as node-postgres returns it. */
interface LogRow {
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
  const { rows } = await pool.query<LogRow>(q.listRejections(opts.fenceKey, opts.before, opts.limit + 1));
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
  const { rows } = await pool.query<{ start: Date; count: number }>(q.rejectionHistogram(minutes, fenceKey));
  return rows.map((r) => ({ start: r.start, count: r.count }));
}
