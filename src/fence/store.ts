// The fence store: what the doors use of the fence over one pg pool. Each job has its module:
// fenced writes, coalesced into batches (coalescer.ts, statements in write-strategy.ts); reads of
// objects, fences and counts (reads.ts); folding count rows into the counters (count-folding.ts);
// the rejection log every door records into (rejection-log.ts); the protected object-key prefixes,
// as last read (protected-prefixes.ts).
import type pg from 'pg';
import type { Logger } from 'pino';
import { WriteCoalescer, type FencedOp, type FencedResult } from './coalescer.ts';
import { fencedStrategy, type WriteStrategy } from './write-strategy.ts';
import * as reads from './reads.ts';
import type { FenceRecord, ObjectInfo, Stats, StoredObject } from './reads.ts';
import { foldPendingCounts, startFolding } from './count-folding.ts';
import { AcceptedCounts } from './accepted-counts.ts';
import { RejectionLog } from './rejection-log.ts';
import { ProtectedPrefixes } from './protected-prefixes.ts';
import { explainLockTimeout } from './prepared-holders.ts';

export type { FencedOp, FencedResult, Precondition } from './coalescer.ts';
export type { RunStatement, WriteOutcome, WriteStrategy } from './write-strategy.ts';
export type { FenceRecord, ObjectInfo, Stats, StoredObject } from './reads.ts';
export type { OpKind } from './sql/objects.ts';
export type { ProtectedPrefix, ProtectedPrefixes } from './protected-prefixes.ts';

/** How the store batches and retries; defaults are the config module's (STORE_DEFAULTS). */
export interface FenceStoreOptions {
  /** Most write batches (statements) in flight at once. */
  concurrency: number;
  /** Most operations in one batch; 1 turns coalescing off. */
  maxBatch: number;
  /** Most body bytes in one batch (a single larger body still goes alone). */
  maxBatchBytes: number;
  /** Retries of a statement that hit a deadlock or serialization failure: a write batch's, and recording rejections on every door. */
  retries: number;
  /** Called once per executed batch, for metrics. */
  onBatch?: (size: number) => void;
  /** Where a rejection that could not be recorded is reported (warn, with the door); absent: nowhere. */
  logger?: Logger;
  /** Repeats of a failure to record within this are counted into one line (STORE_DEFAULTS). */
  logRepeatWindowMs: number;
  /**
   * Test seam: another way to write a batch, handed in by the checker's self-tests and the
   * benchmark's unfenced baseline (tools/unsafe-fence.ts). Nothing in the product sets it.
   */
  __test__writeStrategy?: WriteStrategy;
}

export class FenceStore {
  readonly pool: pg.Pool;
  /** The rejection log: the store's writes record into it, and so do the other doors (transactions, the SQL endpoint). */
  readonly rejections: RejectionLog;
  /**
   * The protected object-key prefixes as last read: the door resolves a write's fence key from them
   * (Postgres enforces them regardless).
   */
  readonly protectedPrefixes: ProtectedPrefixes;
  /** Accepted counts of the SQL doors, added to the counters in batches (accepted-counts.ts); the reads below flush them first. */
  readonly accepted: AcceptedCounts;
  private readonly coalescer: WriteCoalescer;

  constructor(pool: pg.Pool, opts: FenceStoreOptions) {
    this.pool = pool;
    this.accepted = new AcceptedCounts(pool);
    this.rejections = new RejectionLog(pool, {
      retries: opts.retries,
      logRepeatWindowMs: opts.logRepeatWindowMs,
      ...(opts.logger ? { logger: opts.logger } : {}),
    });
    this.protectedPrefixes = new ProtectedPrefixes(pool);
    this.coalescer = new WriteCoalescer(pool, {
      concurrency: opts.concurrency,
      maxBatch: opts.maxBatch,
      maxBatchBytes: opts.maxBatchBytes,
      retries: opts.retries,
      onBatch: opts.onBatch,
      writeStrategy: opts.__test__writeStrategy ?? fencedStrategy(),
      rejections: this.rejections,
    });
  }

  /**
   * Applies one fenced operation; resolves once it is committed (or rejected). A lock timeout on a
   * fence row a prepared transaction holds rejects with a FenceHeldByPreparedError naming it.
   */
  write(op: FencedOp): Promise<FencedResult> {
    return this.coalescer.write(op).catch(async (err: unknown) => {
      throw await explainLockTimeout(this.pool, [op.fenceKey], err);
    });
  }

  /** Resolves when no write is queued or running. */
  idle(): Promise<void> {
    return this.coalescer.idle();
  }

  readObject(key: string): Promise<StoredObject | null> {
    return reads.readObject(this.pool, key);
  }

  /** One page of objects whose keys start with `prefix`, after `after` (reads.ts listObjects). */
  listObjects(prefix: string, after: string | null, limit: number): Promise<{ objects: ObjectInfo[]; next: string | null }> {
    return reads.listObjects(this.pool, prefix, after, limit);
  }

  readHighestToken(fenceKey: string): Promise<bigint | null> {
    return reads.readHighestToken(this.pool, fenceKey);
  }

  readLeadingFence(prefix: string): ReturnType<typeof reads.readLeadingFence> {
    return reads.readLeadingFence(this.pool, prefix);
  }

  async readFence(fenceKey: string): Promise<FenceRecord | null> {
    await this.flushCounts();
    return reads.readFence(this.pool, fenceKey);
  }

  /** One page of fences in key order, and the cursor of the next page (null at the end). */
  async listFences(after: string | null, limit: number): Promise<{ fences: FenceRecord[]; next: string | null }> {
    await this.flushCounts();
    return reads.listFences(this.pool, after, limit);
  }

  /**
   * The counters, after this proxy's own counts are flushed; `unflushed`: what this proxy counted that
   * they still lack (its flush failed).
   */
  async stats(perFenceLimit: number): Promise<Stats & { unflushed: number }> {
    await this.flushCounts();
    const s = await reads.readStats(this.pool, perFenceLimit);
    return { ...s, unflushed: this.accepted.unflushed };
  }

  /** This proxy's accepted counts, added to the counters now (a failure leaves them for the next flush). */
  flushCounts(): Promise<void> {
    return this.accepted.flush().catch(() => {});
  }

  /** Folds the count rows not folded yet into the counters, once (count-folding.ts). */
  foldPendingCounts(): Promise<void> {
    return foldPendingCounts(this.pool);
  }

  /** Folds every FOLD_INTERVAL_MS (count-folding.ts), one fold at a time, until stopped (the returned function). */
  folding(onError: (err: unknown) => void): () => void {
    this.accepted.start(onError);
    return startFolding(this.pool, onError);
  }
}
