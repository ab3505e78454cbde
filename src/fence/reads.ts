// Reads of objects, fences and counts, one statement each (sql/objects.ts, sql/fences.ts, sql/counts.ts), as the proxy answers them.
// The count reads add the count rows not folded yet (count-folding.ts), so they are exact.
import type pg from 'pg';
import * as countsSql from './sql/counts.ts';
import * as fencesSql from './sql/fences.ts';
import * as objectsSql from './sql/objects.ts';

export interface StoredObject {
  fenceKey: string;
  token: bigint;
  version: bigint;
  /** Without quotes; changes with every write and never repeats for a key (sql/objects.ts ETAG_SQL). */
  etag: string;
  contentType: string;
  body: Buffer;
  updatedAt: Date;
}

/** An object in a listing: what GET answers, without the body. */
export interface ObjectInfo {
  key: string;
  fenceKey: string;
  token: bigint;
  version: bigint;
  etag: string;
  contentType: string;
  size: number;
  updatedAt: Date;
}

export interface FenceRecord {
  fenceKey: string;
  highestToken: bigint;
  updatedAt: Date;
  /** Writer-Id of the write that raised the fence to `highestToken`; null if it sent none. */
  raisedBy: string | null;
  accepted: bigint;
  rejected: bigint;
}

export interface Stats {
  fences: number;
  accepted: bigint;
  rejected: bigint;
  perFence: { fenceKey: string; highestToken: bigint; raisedBy: string | null; raisedAt: Date; accepted: bigint; rejected: bigint }[];
}

export async function readObject(pool: pg.Pool, key: string): Promise<StoredObject | null> {
  const { rows } = await pool.query<{
    fence_key: string;
    token: string;
    version: string;
    etag: string;
    content_type: string;
    body: Buffer;
    updated_at: Date;
  }>(objectsSql.readObject(key));
  const r = rows[0];
  if (!r) return null;
  return {
    fenceKey: r.fence_key,
    token: BigInt(r.token),
    version: BigInt(r.version),
    etag: r.etag,
    contentType: r.content_type,
    body: r.body,
    updatedAt: r.updated_at,
  };
}

/**
 * One page of objects in key order (byte order) whose keys start with `prefix` ('' for all),
 * after `after`; `next` is the cursor of the next page (null at the end).
 */
export async function listObjects(
  pool: pg.Pool,
  prefix: string,
  after: string | null,
  limit: number,
): Promise<{ objects: ObjectInfo[]; next: string | null }> {
  const { rows } = await pool.query<{
    key: string;
    fence_key: string;
    token: string;
    version: string;
    etag: string;
    content_type: string;
    size: number;
    updated_at: Date;
  }>(objectsSql.listObjects(prefix, after, limit + 1));
  const page = rows.slice(0, limit).map((r) => ({
    key: r.key,
    fenceKey: r.fence_key,
    token: BigInt(r.token),
    version: BigInt(r.version),
    etag: r.etag,
    contentType: r.content_type,
    size: r.size,
    updatedAt: r.updated_at,
  }));
  return { objects: page, next: rows.length > limit ? (page.at(-1)?.key ?? null) : null };
}

/** Each object's fence key and that fence's highest token, read after a refusal (the 409 reports them). */
export async function readObjectFences(pool: pg.Pool, keys: string[]): Promise<Map<string, { fenceKey: string; highestToken: bigint }>> {
  const { rows } = await pool.query<{ key: string; fence_key: string; highest_token: string }>(objectsSql.objectFences(keys));
  return new Map(rows.map((r) => [r.key, { fenceKey: r.fence_key, highestToken: BigInt(r.highest_token) }]));
}

export async function readHighestToken(pool: pg.Pool, fenceKey: string): Promise<bigint | null> {
  const { rows } = await pool.query<{ highest_token: string }>(fencesSql.readHighestToken(fenceKey));
  return rows[0] ? BigInt(rows[0].highest_token) : null;
}

/** The fence with the highest token under `prefix` (sql/fences.ts leadingFence); null when none. */
export async function readLeadingFence(
  pool: pg.Pool,
  prefix: string,
): Promise<{ fenceKey: string; highestToken: bigint; raisedBy: string | null; raisedAt: Date } | null> {
  const { rows } = await pool.query<{ fence_key: string; highest_token: string; raised_by: string | null; updated_at: Date }>(
    fencesSql.leadingFence(prefix),
  );
  const r = rows[0];
  return r ? { fenceKey: r.fence_key, highestToken: BigInt(r.highest_token), raisedBy: r.raised_by, raisedAt: r.updated_at } : null;
}

export async function readFence(pool: pg.Pool, fenceKey: string): Promise<FenceRecord | null> {
  const { rows } = await pool.query<FenceRow>(fencesSql.readFence(fenceKey));
  return rows[0] ? toFence(rows[0]) : null;
}

/** One page of fences in key order, and the cursor of the next page (null at the end). */
export async function listFences(
  pool: pg.Pool,
  after: string | null,
  limit: number,
): Promise<{ fences: FenceRecord[]; next: string | null }> {
  const { rows } = await pool.query<FenceRow>(fencesSql.listFences(after, limit + 1));
  const page = rows.slice(0, limit).map(toFence);
  return { fences: page, next: rows.length > limit ? (page.at(-1)?.fenceKey ?? null) : null };
}

export async function readStats(pool: pg.Pool, perFenceLimit: number): Promise<Stats> {
  const [totals, per] = await Promise.all([
    pool.query<{ fences: string; accepted: string; rejected: string }>(countsSql.statsTotals()),
    pool.query<{
      fence_key: string;
      highest_token: string;
      raised_by: string | null;
      updated_at: Date;
      accepted: string;
      rejected: string;
    }>(countsSql.statsPerFence(perFenceLimit)),
  ]);
  const t = totals.rows[0]!;
  return {
    fences: Number(t.fences),
    accepted: BigInt(t.accepted),
    rejected: BigInt(t.rejected),
    perFence: per.rows.map((r) => ({
      fenceKey: r.fence_key,
      highestToken: BigInt(r.highest_token),
      raisedBy: r.raised_by,
      raisedAt: r.updated_at,
      accepted: BigInt(r.accepted),
      rejected: BigInt(r.rejected),
    })),
  };
}

interface FenceRow {
  fence_key: string;
  highest_token: string;
  updated_at: Date;
  raised_by: string | null;
  accepted: string;
  rejected: string;
}

function toFence(r: FenceRow): FenceRecord {
  return {
    fenceKey: r.fence_key,
    highestToken: BigInt(r.highest_token),
    updatedAt: r.updated_at,
    raisedBy: r.raised_by,
    accepted: BigInt(r.accepted),
    rejected: BigInt(r.rejected),
  };
}
