// The fence, as every door holds it: one object per proxy (src/proxy/shared.ts builds it; the HTTP
// app builds one of its own when run alone), with a verb per thing a door asks of it. Each verb is
// a thin delegation to the module that does the job:
// - write / advance: a fenced object write or a fence advance (the store: store.ts, coalescer.ts),
//   with the one policy for a fence held past the lock timeout (raise, then write again);
// - transact: a /v1/transactions transaction (transaction.ts), which raises through this object;
// - enterSession: the SQL endpoint's connection fence (session-fence.ts), which raises through
//   this object;
// - raise / raisedAbove: the raise itself (raise.ts), the only way any door moves a fence up in a
//   transaction of the proxy's own, and the wait for a raise that ended a writer's connection;
// - loginFor, connectAs: the client logins writers' SQL runs as (client-logins.ts);
// - the reads (objects, fences, rejections, stats) and health().
// No door raises, provisions or reads the fence's tables on its own.
import type pg from 'pg';
import { raiseFences, raisedAbove, type RaisedFence, type RaiseLogger } from './raise.ts';
import {
  connectAs,
  provisionClientLogins,
  type ClientLogin,
  type LoginProblem,
  type LoginSpec,
  type ProvisionResult,
} from './client-logins.ts';
import type { FenceStore, FencedOp, FencedResult } from './store.ts';
import type { FenceRecord, ObjectInfo, Stats, StoredObject } from './reads.ts';
import type { ProtectedPrefixes } from './protected-prefixes.ts';
import type { RejectionRow, Door, UnrecordedListener } from './rejection-log.ts';
import { readRejectionHistogram, readRejections, type HistogramBucket, type RejectionPage } from './rejections.ts';
import {
  TransactionRunner,
  type RunOptions,
  type TransactionSettings,
  type TxFence,
  type TxResult,
  type TxStatement,
} from './transaction.ts';
import { enterSession, warmSession, type SessionBackend, type SessionFence, type SessionRequest } from './session-fence.ts';
import { sqlState } from './pg-errors.ts';
import { LOCK_NOT_AVAILABLE } from './sqlstate.ts';
import { WriteOutcomeUnknownError } from './errors.ts';
import { migrationsApplied } from './migrate.ts';
import { writability } from './sql/health.ts';

export interface FenceOptions {
  /** Where object writes go and the fence's tables are read (its pool is the proxy's own, DATABASE_URL's role). */
  store: FenceStore;
  /** Login name in open mode, and prefix of the per-key logins. */
  clientRole: string;
  /** Keys whose writers run SQL (`keyName: null` for open mode). */
  logins: readonly LoginSpec[];
  /** How long an incomplete provisioning stands before the next caller tries again. */
  provisionRetryMs: number;
  /** Login problems found at provisioning (once per problem). */
  onProblem?: (keyName: string | null, problem: LoginProblem) => void;
  /** A raise waits this long for older tokens' transactions, then ends them. */
  raiseWaitMs: number;
  /** A raise fails (55P03) if the fence is still held this long after its holders were ended. */
  lockTimeoutMs: number;
  /** How /v1/transactions runs (transaction.ts); absent: transact() is refused. */
  transactions?: TransactionSettings;
  /** Where a raise says what it ended, unless the caller names a logger of its own. */
  logger?: RaiseLogger;
}

/** Who asks for a write: its Writer-Id is in the op; where a raise it causes says what it ended. */
export interface WriteContext {
  logger?: RaiseLogger;
}

/** What health() found: the database reachable, migrated, and taking writes. */
export interface FenceHealth {
  migrated: boolean;
  /** A standby: answers reads, refuses every write. */
  recovery: boolean;
  /** default_transaction_read_only is on. */
  readOnly: boolean;
}

export class Fence {
  private readonly opts: FenceOptions;
  private readonly store: FenceStore;
  private readonly owner: pg.Pool;
  private runner: TransactionRunner | null = null;
  private provisioned: { at: number; result: Promise<ProvisionResult> } | null = null;

  constructor(opts: FenceOptions) {
    this.opts = opts;
    this.store = opts.store;
    this.owner = opts.store.pool;
  }

  // ---- Object writes and fence advances (the HTTP door) ----

  /**
   * Applies one fenced operation; resolves once it is committed (or rejected). A fence held past
   * the lock timeout by an older token (a paused leader's transaction, say) is raised to the op's
   * token (raise.ts ends the holders at once: they have had the lock timeout) and the op goes once
   * more. A raise whose COMMIT went unanswered rejects with its WriteOutcomeUnknownError (it may
   * have raised the fence; the op itself was not written); any other failure of the raise rejects
   * with the lock's error (nothing committed).
   */
  async write(op: FencedOp, ctx: WriteContext = {}): Promise<FencedResult> {
    const since = Date.now();
    try {
      return await this.store.write(op);
    } catch (err) {
      if (sqlState(err) !== LOCK_NOT_AVAILABLE) throw err;
      const highest = await this.store.readHighestToken(op.fenceKey).catch(() => null);
      if ((highest ?? -1n) >= op.token) throw err;
      const [raised] = await this.raiseFor([{ fenceKey: op.fenceKey, token: op.token }], op.writerId ?? null, {
        since,
        ...(ctx.logger ? { logger: ctx.logger } : {}),
      }).catch((e: unknown) => {
        throw e instanceof WriteOutcomeUnknownError ? e : err;
      });
      if (raised?.highestToken !== op.token) throw err; // a raise above it won meanwhile: the caller's retry reads it
      return await this.store.write(op);
    }
  }

  /** Advances `fenceKey` to `token` without writing data (PUT /v1/fences): write() of a fence op. */
  advance(fenceKey: string, token: bigint, writerId: string | null, ctx: WriteContext = {}): Promise<FencedResult> {
    return this.write({ kind: 'fence', fenceKey, token, writerId }, ctx);
  }

  /** Resolves when no object write is queued or running. */
  idle(): Promise<void> {
    return this.store.idle();
  }

  /** The protected object-key prefixes, as last read: a door resolves a write's fence key from them. */
  get protectedPrefixes(): ProtectedPrefixes {
    return this.store.protectedPrefixes;
  }

  // ---- SQL transactions (/v1/transactions) ----

  /** Runs one fenced transaction as `keyName`'s login (null: open mode); see transaction.ts. */
  transact(keyName: string | null, fences: readonly TxFence[], statements: readonly TxStatement[], opts: RunOptions): Promise<TxResult> {
    if (this.runner === null) {
      if (!this.opts.transactions) return Promise.reject(new Error('SQL transactions are not set up on this fence'));
      this.runner = new TransactionRunner(
        {
          owner: this.owner,
          provision: () => this.provision(),
          raiseFor: (fences, writerId, opts) => this.raiseFor(fences, writerId, opts),
          raisedAbove: (fenceKey, token, waitMs) => this.raisedAbove(fenceKey, token, waitMs),
          lockTimeoutMs: this.opts.lockTimeoutMs,
          rejections: this.store.rejections,
          countAccepted: (fenceKeys) => this.store.accepted.add([...fenceKeys]),
        },
        this.opts.transactions,
      );
    }
    return this.runner.run(keyName, fences, statements, opts);
  }

  // ---- The SQL endpoint's connections ----

  /** Fences a new SQL connection from its startup settings, on its own backend (session-fence.ts). */
  enterSession(request: SessionRequest, backend: SessionBackend): Promise<SessionFence> {
    return enterSession(this, request, backend);
  }

  /** Readies a backend no writer has yet for enterSession (session-fence.ts warmSession). */
  warmSession(capability: string, backend: SessionBackend): Promise<boolean> {
    return warmSession(capability, backend);
  }

  /** A committed transaction of a fenced SQL connection, counted as every door's (in batches). */
  countAccepted(fenceKey: string): void {
    this.store.accepted.addOne(fenceKey);
  }

  // ---- Raises ----

  /**
   * The raise every door's verb makes for a new leader (write, transact, enterSession): the one
   * policy of how long older tokens' holders are waited for. A new leader waits at most
   * FENCEPOST_RAISE_WAIT_MS for them, counted from `since`, its first attempt (a write that already
   * waited out the lock timeout on their row lock raises at once), then the raise ends them.
   */
  raiseFor(
    fences: readonly { fenceKey: string; token: bigint }[],
    writerId: string | null,
    opts: { since: number; logger?: RaiseLogger },
  ): Promise<RaisedFence[]> {
    const waitMs = Math.max(0, this.opts.raiseWaitMs - (Date.now() - opts.since));
    return this.raise(fences, writerId, { waitMs, ...(opts.logger ? { logger: opts.logger } : {}) });
  }

  /**
   * Raises each fence to its token where it is absent or below, in a transaction of the proxy's
   * own, ending older tokens' holders after `waitMs` (default: the configured wait); each fence's
   * highest token after. Rejects as raise.ts raiseFences does.
   */
  raise(
    fences: readonly { fenceKey: string; token: bigint }[],
    writerId: string | null,
    opts: { waitMs?: number; logger?: RaiseLogger } = {},
  ): Promise<RaisedFence[]> {
    const logger = opts.logger ?? this.opts.logger;
    return raiseFences(this.owner, fences, writerId, {
      waitMs: opts.waitMs ?? this.opts.raiseWaitMs,
      lockTimeoutMs: this.opts.lockTimeoutMs,
      ...(logger ? { logger } : {}),
    });
  }

  /** raise() for one fence: its highest token after (null when a raise above it won meanwhile). */
  async raiseOne(
    fenceKey: string,
    token: bigint,
    writerId: string | null,
    opts: { waitMs?: number; logger?: RaiseLogger } = {},
  ): Promise<bigint | null> {
    return (await this.raise([{ fenceKey, token }], writerId, opts))[0]!.highestToken;
  }

  /** The fence's highest token once a raise above `token` commits (waiting up to `waitMs`), else null. */
  raisedAbove(fenceKey: string, token: bigint, waitMs: number): Promise<bigint | null> {
    return raisedAbove(this.owner, fenceKey, token, waitMs);
  }

  /** How long a raise may take to commit once it ended its holders. */
  get lockTimeoutMs(): number {
    return this.opts.lockTimeoutMs;
  }

  // ---- Client logins ----

  /** Creates or checks the client logins and the fence capability (memoised; an incomplete result is tried again after a while). */
  provision(): Promise<ProvisionResult> {
    const p = this.provisioned;
    if (p && Date.now() - p.at < this.opts.provisionRetryMs) return p.result;
    const result = provisionClientLogins(this.owner, this.opts.clientRole, this.opts.logins);
    this.provisioned = { at: Date.now(), result };
    void result.then(
      (r) => {
        if (r.problems.size === 0) this.provisioned = { at: Infinity, result };
        for (const [key, problem] of r.problems) this.opts.onProblem?.(key, problem);
      },
      () => {},
    );
    return result;
  }

  /** The client login of `keyName` (null: open mode), or why there is none; and the fence capability. */
  async loginFor(keyName: string | null): Promise<{ login: ClientLogin | null; problem: LoginProblem | null; capability: string }> {
    const { logins, problems, capability } = await this.provision();
    return { login: logins.get(keyName) ?? null, problem: problems.get(keyName) ?? null, capability };
  }

  /** Runs `connect` as `login`; a refused password is set again once and `connect` tried again (client-logins.ts). */
  connectAs<T>(login: ClientLogin, connect: () => Promise<T>): Promise<T> {
    return connectAs(this.owner, login, connect);
  }

  // ---- Refusals and commits, recorded ----

  /** Records refused writes of `door` without waiting (a failure is counted and logged by the log). */
  recordRefusals(door: Door, rows: RejectionRow[]): void {
    this.store.rejections.recordInBackground(door, rows);
  }

  /** Calls `listener` for each refusal that could not be recorded; returns the function that stops it. */
  onUnrecordedRefusals(listener: UnrecordedListener): () => void {
    return this.store.rejections.onUnrecorded(listener);
  }

  // ---- Reads ----

  object(key: string): Promise<StoredObject | null> {
    return this.store.readObject(key);
  }

  /** One page of objects whose keys start with `prefix`, after `after`. */
  objects(prefix: string, after: string | null, limit: number): Promise<{ objects: ObjectInfo[]; next: string | null }> {
    return this.store.listObjects(prefix, after, limit);
  }

  fence(fenceKey: string): Promise<FenceRecord | null> {
    return this.store.readFence(fenceKey);
  }

  /** One page of fences in key order, and the cursor of the next page (null at the end). */
  fences(after: string | null, limit: number): Promise<{ fences: FenceRecord[]; next: string | null }> {
    return this.store.listFences(after, limit);
  }

  highestToken(fenceKey: string): Promise<bigint | null> {
    return this.store.readHighestToken(fenceKey);
  }

  /** The fence with the highest token among those whose keys start with `prefix` (an election's). */
  leadingFence(prefix: string): ReturnType<FenceStore['readLeadingFence']> {
    return this.store.readLeadingFence(prefix);
  }

  /** One page of the rejection log, newest first. */
  rejectionsPage(opts: { fenceKey: string | null; before: bigint | null; limit: number }): Promise<RejectionPage> {
    return readRejections(this.owner, opts);
  }

  /** Rejections per minute over the last `minutes`. */
  rejectionHistogram(minutes: number, fenceKey: string | null): Promise<HistogramBucket[]> {
    return readRejectionHistogram(this.owner, minutes, fenceKey);
  }

  /** The counters (this proxy's own counts flushed first); `unflushed`: what they still lack. */
  stats(perFenceLimit: number): Promise<Stats & { unflushed: number }> {
    return this.store.stats(perFenceLimit);
  }

  /** This proxy's accepted counts, added to the counters now (a failure leaves them for the next flush). */
  flushCounts(): Promise<void> {
    return this.store.flushCounts();
  }

  /** Is the database reachable, migrated and taking writes? Rejects when it cannot be reached. */
  async health(): Promise<FenceHealth> {
    const migrated = await migrationsApplied(this.owner);
    if (!migrated) return { migrated, recovery: false, readOnly: false };
    const { rows } = await this.owner.query<{ recovery: boolean; read_only: string }>(writability());
    return { migrated, recovery: rows[0]?.recovery === true, readOnly: rows[0]?.read_only === 'on' };
  }

  // ---- Life ----

  /** Folds count rows into the counters on a timer until stopped (the returned function). */
  folding(onError: (err: unknown) => void): () => void {
    return this.store.folding(onError);
  }

  /** Ends the transaction runner's pools. */
  async close(): Promise<void> {
    await this.runner?.close();
  }
}
