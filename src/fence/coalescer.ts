// Fenced writes, coalesced (group commit). Requests queue; whenever fewer than `concurrency` batches
// are in flight, one is taken from the queue: every queued write whose object key is not already in
// this batch or in a batch in flight (an upsert can touch a row only once per statement). Writes of
// one fence key ride together and beside other batches of that fence: a write with the fence's
// token locks the fence row in share mode, so a leader's writes never wait for one another; only a
// raise takes the row exclusively (src/fence/sql/objects.ts fencedWrite). A request that finds a free
// slot goes out at once; under load, one statement and one commit serve many writes.
//
// A fence row held by another session (a long transaction) must not stall the other fences' writes
// that share its batch or wait for a write slot: the pool's lock_timeout fails such a batch (55P03,
// nothing committed), its operations run again one by one so only the locked fence's writes fail,
// and that fence key then goes in batches of its own, in at most all but one slot, for a while.
//
// A batch holding one write that the protected-prefix trigger refuses (FP403: an object under a
// protected prefix written under another fence key) fails whole, nothing committed: its operations
// run again one by one too, so only the misfenced write gets the error.
//
// Which statement carries a batch: write-strategy.ts. Rejected operations go to the rejection log
// (rejection-log.ts) as the HTTP door's.
import type pg from 'pg';
import type { Query } from './sql/query.ts';
import type { WriteRow } from './sql/objects.ts';
import { isLostAfterSend, sqlState } from './pg-errors.ts';
import { NOT_FENCED } from './codes.ts';
import { retryOnConflict, STATEMENT_BACKOFF_MS } from './retry.ts';
import { type RunStatement, type WriteOutcome, type WriteStrategy } from './write-strategy.ts';
import { readObjectFences } from './reads.ts';
import type { RejectionLog } from './rejection-log.ts';
import { watchCommit } from './commit-outcome.ts';
import { withClient } from './checkout.ts';
import { LOCK_NOT_AVAILABLE } from './sqlstate.ts';
import { WriteOutcomeUnknownError } from './errors.ts';
import { PartialWriteError } from './write-strategy.ts';

/**
 * How long a fence key whose lone write hit the lock timeout is kept out of shared batches, unless
 * one of its writes completes first; each write that hits the lock again starts it anew. It only
 * bounds how long a key nobody writes any more is remembered, and how often a fence locked for
 * good can cost one shared batch a lock timeout and a split.
 */
const LOCKED_FENCE_ALONE_MS = 10_000;

/** Writes that must be waiting before a batch starts beside one already in flight (see pump). */
const MIN_EXTRA_BATCH = 8;
/** The longest the queue waits for MIN_EXTRA_BATCH writes while batches are in flight (see pump). */
const HOLD_BACK_MS = 2;

/**
 * A conditional write's precondition on its object, checked in the fenced write statement (see
 * fencedWrite): `ifMatch` is `*` (the object exists) or ETags without their quotes, one of which
 * the object must have; `ifNoneMatch` (If-None-Match: *) that it does not exist.
 */

export interface Precondition {
  ifMatch?: '*' | readonly string[] | null;
  ifNoneMatch?: boolean;
}

export type FencedOp =
  | ({
      kind: 'put';
      key: string;
      fenceKey: string;
      token: bigint;
      contentType: string;
      body: Buffer;
      writerId: string | null;
    } & Precondition)
  | ({ kind: 'delete'; key: string; fenceKey: string; token: bigint; writerId: string | null } & Precondition)
  | { kind: 'fence'; fenceKey: string; token: bigint; writerId: string | null };

export type FencedResult =
  /** `etag` (without quotes) and `version`: the object as this put left it; null for deletes and fences. */
  | { accepted: true; highestToken: bigint; version: bigint | null; etag: string | null }
  /** Rejected by a fence. `fenceKey`: the object's fence the token lost against, when not the request's own (object_refused). */
  | { accepted: false; highestToken: bigint; fenceKey?: string; preconditionFailed?: false }
  /**
   * The token passed the fences (and raised its own), but the object failed the precondition:
   * nothing written, counted neither as accepted nor as rejected.
   */
  | { accepted: false; highestToken: bigint; preconditionFailed: true };

/** How the coalescer batches and retries; the store hands in the config module's defaults (STORE_DEFAULTS). */
export interface CoalescerOptions {
  /** Most write batches (statements) in flight at once. */
  concurrency: number;
  /** Most operations in one batch; 1 turns coalescing off. */
  maxBatch: number;
  /** Most body bytes in one batch (a single larger body still goes alone). */
  maxBatchBytes: number;
  /** Retries of a statement that hit a deadlock or serialization failure. */
  retries: number;
  /** Called once per executed batch, for metrics. */
  onBatch: ((size: number) => void) | undefined;
  writeStrategy: WriteStrategy;
  /** Where rejected operations are recorded (door `http`). */
  rejections: RejectionLog;
}

interface Pending {
  op: FencedOp;
  resolve: (r: FencedResult) => void;
  reject: (e: unknown) => void;
}

export class WriteCoalescer {
  private readonly pool: pg.Pool;
  private queue: Pending[] = [];
  private readonly concurrency: number;
  private running = 0;
  /** Object keys of the batches in flight. */
  private readonly busyObjects = new Set<string>();
  /** Fence keys whose lone write hit the lock timeout, and until when they go only alone. */
  private readonly lockedFences = new Map<string, number>();
  /** Batches in flight that hold a key of lockedFences. */
  private runningAlone = 0;
  private readonly maxBatch: number;
  private readonly maxBatchBytes: number;
  private readonly retries: number;
  private readonly onBatch: ((size: number) => void) | undefined;
  private readonly writeStrategy: WriteStrategy;
  private readonly rejections: RejectionLog;
  private inFlight = 0;
  private idleWaiters: (() => void)[] = [];
  /** The batches in flight: when each started, and whether it holds a locked fence. */
  private readonly flights = new Set<{ start: number; alone: boolean }>();
  private pumpTimer: NodeJS.Timeout | null = null;

  constructor(pool: pg.Pool, opts: CoalescerOptions) {
    this.pool = pool;
    this.concurrency = Math.max(1, opts.concurrency);
    this.maxBatch = Math.max(1, opts.maxBatch);
    this.maxBatchBytes = opts.maxBatchBytes;
    this.retries = opts.retries;
    this.onBatch = opts.onBatch;
    this.writeStrategy = opts.writeStrategy;
    this.rejections = opts.rejections;
  }

  /** Applies one fenced operation; resolves once it is committed (or rejected). */
  write(op: FencedOp): Promise<FencedResult> {
    return new Promise((resolve, reject) => {
      this.queue.push({ op, resolve, reject });
      this.inFlight++;
      this.pump();
    });
  }

  /** Resolves when no write is queued or running. */
  async idle(): Promise<void> {
    if (this.inFlight === 0) return;
    await new Promise<void>((r) => this.idleWaiters.push(r));
  }

  /**
   * Starts batches while there is a free slot and something that can go. A batch goes at once when
   * none is in flight. Beside batches in flight it waits, for at most HOLD_BACK_MS, until
   * MIN_EXTRA_BATCH writes queue: a statement costs Postgres about as much as a dozen writes in it,
   * so a second statement carrying one write would cost more than waiting for the first to commit.
   * A batch in flight for longer (waiting on a lock, say) or holding a locked fence never holds
   * the others back.
   */
  private pump(): void {
    while (this.running < this.concurrency && this.queue.length > 0) {
      if (this.holdBack()) return;
      const { batch, alone } = this.takeBatch();
      if (batch.length === 0) return; // everything queued waits on a key in flight
      const flight = { start: performance.now(), alone };
      this.flights.add(flight);
      this.running++;
      if (alone) this.runningAlone++;
      const objects = batch.flatMap((p) => (p.op.kind === 'fence' ? [] : [p.op.key]));
      for (const o of objects) this.busyObjects.add(o);
      void this.runSplitting(batch.map((p) => p.op))
        .then(
          (results) => ({ results }),
          (err: unknown) => ({ err }),
        )
        .then((out) => {
          for (const o of objects) this.busyObjects.delete(o);
          this.flights.delete(flight);
          this.running--;
          if (alone) this.runningAlone--;
          try {
            // The writes that queued meanwhile go to Postgres before these answers are written.
            this.pump();
          } finally {
            batch.forEach((p, i) => {
              const r = 'results' in out ? out.results[i]! : { failed: out.err };
              if ('failed' in r) p.reject(r.failed);
              else p.resolve(r);
            });
            this.inFlight -= batch.length;
            if (this.inFlight === 0) for (const w of this.idleWaiters.splice(0)) w();
          }
        });
    }
  }

  /** Should the queue wait for the batches in flight (see pump)? If so, pump again when that wait ends. */
  private holdBack(): boolean {
    if (this.running === 0 || this.queue.length >= Math.min(MIN_EXTRA_BATCH, this.maxBatch)) return false;
    const now = performance.now();
    let oldest = now;
    for (const f of this.flights) {
      if (f.alone) return false;
      oldest = Math.min(oldest, f.start);
    }
    const wait = oldest + HOLD_BACK_MS - now;
    if (wait <= 0) return false;
    if (this.pumpTimer === null) {
      this.pumpTimer = setTimeout(() => {
        this.pumpTimer = null;
        this.pump();
      }, Math.ceil(wait));
      this.pumpTimer.unref(); // a batch in flight keeps the process alive; its end pumps too
    }
    return true;
  }

  /**
   * Takes, in queue order, writes whose fence and object keys are free (not in flight, not already
   * in this batch). A write left behind reserves its keys for this scan, so later writes on the same
   * keys stay behind it (order per key). A write on a recently locked fence key (lockedFences) goes
   * only alone (`alone`), and such batches leave one slot to the others when there are two or more.
   */
  private takeBatch(): { batch: Pending[]; alone: boolean } {
    const batch: Pending[] = [];
    const rest: Pending[] = [];
    const objectKeys = new Set<string>();
    const now = Date.now();
    const aloneSlotFree = this.runningAlone < Math.max(1, this.concurrency - 1);
    let alone = false;
    let bytes = 0;
    let i = 0;
    for (; i < this.queue.length && batch.length < this.maxBatch && !alone; i++) {
      const p = this.queue[i]!;
      const key = p.op.kind === 'fence' ? null : p.op.key;
      const size = p.op.kind === 'put' ? p.op.body.length : 0;
      const locked = this.isLocked(p.op.fenceKey, now);
      // Many writes of one fence key may share a batch and run beside batches holding the same
      // fence: writes of the fence's token lock it in share mode (see fencedWrite).
      const fits =
        (key === null || (!objectKeys.has(key) && !this.busyObjects.has(key))) &&
        (batch.length === 0 || bytes + size <= this.maxBatchBytes) &&
        (locked ? batch.length === 0 && aloneSlotFree : true);
      (fits ? batch : rest).push(p);
      if (key !== null) objectKeys.add(key);
      if (fits) bytes += size;
      if (fits && locked) alone = true;
    }
    this.queue = rest.concat(this.queue.slice(i));
    return { batch, alone };
  }

  private isLocked(fenceKey: string, now: number): boolean {
    if (this.lockedFences.size === 0) return false;
    const until = this.lockedFences.get(fenceKey);
    if (until === undefined) return false;
    if (until > now) return true;
    this.lockedFences.delete(fenceKey);
    return false;
  }

  /**
   * Runs a batch. Operations that waited past the lock timeout (55P03) rolled back: the whole
   * batch, or what the leaner statement left to the full one after committing its own (those stay
   * answered). They run again one at a time: only those on a locked row fail (with the 55P03
   * error, answered 503 unavailable), and their fence keys go alone for a while. A batch the
   * protected-prefix trigger refused (FP403) rolled back likewise and runs again one at a time:
   * only the misfenced writes fail, with FP403.
   */
  private async runSplitting(ops: FencedOp[]): Promise<(FencedResult | { failed: unknown })[]> {
    let results: (FencedResult | { failed: unknown })[];
    try {
      results = await this.runBatch(ops);
    } catch (err) {
      const state = sqlState(err);
      if (state !== LOCK_NOT_AVAILABLE && state !== NOT_FENCED) throw err;
      if (ops.length === 1) {
        if (state === LOCK_NOT_AVAILABLE) {
          const now = Date.now();
          for (const [k, until] of this.lockedFences) if (until <= now) this.lockedFences.delete(k);
          this.lockedFences.set(ops[0]!.fenceKey, now + LOCKED_FENCE_ALONE_MS);
        }
        throw err;
      }
      results = ops.map(() => ({ failed: err }));
    }
    const splits = (r: FencedResult | { failed: unknown }) => {
      if (!('failed' in r)) return false;
      const state = sqlState(r.failed);
      return state === LOCK_NOT_AVAILABLE || state === NOT_FENCED;
    };
    if (ops.length > 1 && results.some(splits)) {
      // One at a time: the connection count stays that of one batch, and order per key holds.
      for (const [i, op] of ops.entries()) {
        if (!splits(results[i]!)) continue;
        try {
          results[i] = (await this.runSplitting([op]))[0]!;
        } catch (e) {
          results[i] = { failed: e };
        }
      }
      return results;
    }
    if (this.lockedFences.size > 0)
      for (const [i, op] of ops.entries()) if (!('failed' in results[i]!)) this.lockedFences.delete(op.fenceKey);
    return results;
  }

  /**
   * Runs one batch. An operation whose outcome could not be completed comes back as `{ failed }`:
   * when recording the rejections fails, the writes the fenced statement committed are still
   * answered as accepted, and only the rejected ones get the error.
   */
  private async runBatch(ops: FencedOp[]): Promise<(FencedResult | { failed: unknown })[]> {
    this.onBatch?.(ops.length);
    const writeRows = ops.map((op): WriteRow => ({
      kind: op.kind,
      fenceKey: op.fenceKey,
      key: op.kind === 'fence' ? null : op.key,
      token: op.token,
      contentType: op.kind === 'put' ? op.contentType : null,
      body: op.kind === 'put' ? op.body : null,
      ifMatch: op.kind === 'fence' ? null : (op.ifMatch ?? null),
      ifNoneMatch: op.kind !== 'fence' && op.ifNoneMatch === true,
      writerId: op.writerId,
    }));
    let outcomes: WriteOutcome[];
    let partial: PartialWriteError | null = null;
    try {
      outcomes = await this.writeStrategy(this.runStatement, writeRows);
    } catch (err) {
      if (!(err instanceof PartialWriteError)) throw err;
      partial = err;
      outcomes = err.applied;
    }
    const results: (FencedResult | { failed: unknown } | undefined)[] = new Array(ops.length);
    if (partial) for (let i = 0; i < ops.length; i++) results[i] = { failed: partial.cause };
    const rejected: number[] = [];
    const refused = new Set<number>(); // passed its fence, refused by the object's (current) fence
    for (const row of outcomes) {
      if (row.object_refused === true) refused.add(row.ord);
      if (row.highest_token === null || row.object_refused === true) rejected.push(row.ord);
      else if (row.precondition_failed === true)
        results[row.ord] = { accepted: false, highestToken: BigInt(row.highest_token), preconditionFailed: true };
      else
        results[row.ord] = {
          accepted: true,
          highestToken: BigInt(row.highest_token),
          version: row.version === null ? null : BigInt(row.version),
          etag: row.etag ?? null,
        };
    }
    if (rejected.length > 0) {
      // The accepted writes have committed: if recording the rejections fails, only the rejected
      // operations get the error.
      try {
        const highest = await this.recordRejections(rejected.map((i) => ops[i]!));
        const objects =
          refused.size > 0
            ? await readObjectFences(
                this.pool,
                [...refused].map((i) => (ops[i] as { key: string }).key),
              )
            : new Map<string, { fenceKey: string; highestToken: bigint }>();
        for (const i of rejected) {
          const op = ops[i]!;
          const obj = refused.has(i) && op.kind !== 'fence' ? objects.get(op.key) : undefined;
          results[i] = obj
            ? { accepted: false, highestToken: obj.highestToken, fenceKey: obj.fenceKey }
            : { accepted: false, highestToken: highest.get(op.fenceKey) ?? op.token };
        }
      } catch (err) {
        for (const i of rejected) results[i] = { failed: err };
      }
    }
    return results.map((r, i) => {
      if (!r) throw new Error(`fenced write returned no row for operation ${i}`);
      return r;
    });
  }

  /** Counts and logs rejected operations; returns each fence's highest token, read after the rejection. */
  private recordRejections(ops: FencedOp[]): Promise<Map<string, bigint>> {
    return this.rejections.record(
      'http',
      ops.map((op) => ({
        kind: op.kind,
        fenceKey: op.fenceKey,
        key: op.kind === 'fence' ? null : op.key,
        token: op.token,
        writerId: op.writerId,
      })),
    );
  }

  private readonly runStatement: RunStatement = async <R extends pg.QueryResultRow>(statement: Query) =>
    this.withRetry(async () => {
      // Connecting sends nothing: its failure is "unavailable". Once the statement is sent, a lost
      // connection or the pool's query timeout (a commit waiting for a stalled synchronous standby
      // waits past any statement_timeout) means an autocommit write may have committed, and a
      // commit Postgres warned about is not durable (commit-outcome.ts): never "safe to retry",
      // never a 200. An error Postgres answered with means nothing of the statement committed.
      return await withClient(this.pool, async (client, checkout) => {
        const commit = watchCommit(client);
        try {
          const { rows } = await client.query<R>(statement);
          commit.check();
          return rows;
        } catch (err) {
          if (isLostAfterSend(err)) {
            checkout.discard(err);
            throw new WriteOutcomeUnknownError(err);
          }
          throw err;
        } finally {
          commit.stop();
        }
      });
    });

  private withRetry<T>(fn: () => Promise<T>): Promise<T> {
    return retryOnConflict(fn, { retries: this.retries, backoffMs: STATEMENT_BACKOFF_MS });
  }
}
