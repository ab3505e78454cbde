// Fenced SQL transactions: the fence check and a writer's statements in one database transaction,
// run on a client login that can harm nothing (src/fence/client-logins.ts), never as the owner.
//
// A connection of the key's login passes its fences once per set of fences (sql/transactions.ts
// unfenceSession, fenceSession, endFenceSession: fence_session() with a capability bound to this
// backend and these arguments); a token below its fence is a rejection, recorded; a fence absent or
// below the token is raised first (raise.ts) and the transaction starts again. Then three round
// trips for one statement: reset the session, BEGIN with statement and lock timeouts, SET LOCAL
// ROLE to the key's pgRole and the epoch proof of each fence in one Query (openClientTransaction);
// the statements (extended protocol: one statement per entry); then the seal and COMMIT in one
// Query, with synchronous_commit forced on. A statement that ended the fenced transaction is caught
// by its command tag or the block state, and COMMIT is never sent: a statement can neither end
// the fenced transaction and go on unfenced nor weaken the durability of a fence raise (short of
// a deferred trigger of its own that fires inside COMMIT: docs/security.md). A serialization failure or deadlock runs
// everything again, a bounded number of times. A first round trip that fails for the session's
// sake (not the fence's) drops the connection and runs again on another one.
//
// Nothing a statement does can take the process down or hold shared resources past its limits:
// every checked-out connection has an error listener; result bytes are counted as they arrive and
// the connection is dropped past the cap (nothing buffered beyond it); a whole-transaction deadline
// terminates the backend; at most `maxConcurrent` transactions run at once, on connections of
// their own (never the object-write pool). A backend that dies mid-transaction is a 503 (not
// committed), but an SQLSTATE raised by a statement on a live connection is the statement's error.
import pg from 'pg';
import * as q from './sql/transactions.ts';
import type { Isolation } from './sql/transactions.ts';
import { isRetryable, isUnavailable, sqlState } from './pg-errors.ts';
import { sessionFenceCapability } from './sql/rule.ts';
import type { RaiseLogger } from './raise.ts';
import type { RejectionLog } from './rejection-log.ts';
import { watchCommit } from './commit-outcome.ts';
import {
  CommitUnknownError,
  ConnectionLostError,
  FenceBusyError,
  LoginUnavailableError,
  ResultTooLargeError,
  SessionUnusableError,
  StatementError,
  TransactionEndedError,
  TransactionTimeoutError,
  WriteOutcomeUnknownError,
} from './errors.ts';
import { Slots } from './slots.ts';
import { retryOnConflict } from './retry.ts';
import { clientConfig } from './database-url.ts';
import { leaveOldHosts } from './primary-finder.ts';
import { hearClientErrors } from './checkout.ts';
import { connectAs, type ClientLogin, type ProvisionResult } from './client-logins.ts';
import { ADMIN_SHUTDOWN, LOCK_NOT_AVAILABLE } from './sqlstate.ts';

export type { Isolation };

export interface TxFence {
  fenceKey: string;
  token: bigint;
}

export interface TxStatement {
  sql: string;
  params: unknown[];
}

export interface StatementResult {
  rowCount: number | null;
  rows: Record<string, unknown>[];
}

export type TxResult =
  | { committed: true; results: StatementResult[] }
  | { committed: false; stale: { fenceKey: string; token: bigint; highestToken: bigint }[] };

/** The transaction's fence is absent or below its token: nothing ran; raise it and start again. */
class RaiseFirstError extends Error {
  constructor(cause: unknown) {
    super('the fence must be raised first', { cause });
    this.name = 'RaiseFirstError';
  }
}

/** Fresh connections tried after a SessionUnusableError, per attempt. */
const SESSION_RETRIES = 3;

// Values as Postgres prints them where the JS form would lose something: bytea stays `\x…` hex
// (not a Buffer), timestamps and dates stay text (a Date loses microseconds and the zone).
const TEXT_OIDS = new Set([17, 1082, 1083, 1114, 1184, 1266]);
const resultTypes = {
  getTypeParser: (oid: number, format?: 'text' | 'binary') =>
    TEXT_OIDS.has(oid) ? (v: string) => v : pg.types.getTypeParser(oid, format ?? 'text'),
};

function toRows(r: pg.QueryArrayResult): Record<string, unknown>[] {
  const names = (r.fields ?? []).map((f) => f.name);
  // fromEntries defines own properties, so a column named __proto__ is just a key.
  return r.rows.map((row) => Object.fromEntries(names.map((n, i) => [n, row[i]])));
}

/** What the runner needs of the fence (fence.ts builds it): client logins, raises, and where refusals and commits are recorded. */
export interface TransactionHost {
  /** The proxy's own pool (DATABASE_URL's role): a login's password reset, a runaway backend ended. */
  owner: pg.Pool;
  provision(): Promise<ProvisionResult>;
  /** Fence.raiseFor: the door's one wait policy, counted from `since`. */
  raiseFor(fences: readonly TxFence[], writerId: string | null, opts: { since: number; logger?: RaiseLogger }): Promise<unknown>;
  raisedAbove(fenceKey: string, token: bigint, waitMs: number): Promise<bigint | null>;
  /** How long a raise may take to commit once it ended its holders. */
  lockTimeoutMs: number;
  rejections: RejectionLog;
  countAccepted(fenceKeys: readonly string[]): void;
}

/** How /v1/transactions runs (the config module's TX_DEFAULTS and FENCEPOST_TX_*). */
export interface TransactionSettings {
  /** DATABASE_URL (or the owner pool's settings): client logins connect to the same server and database. */
  database: string | pg.ClientConfig;
  /** Transactions running at once, over all keys. */
  maxConcurrent: number;
  statementTimeoutMs: number;
  lockTimeoutMs: number;
  /** Of maxConcurrent, the most one key may hold at once (the others wait their turn). */
  maxConcurrentPerKey: number;
  /** Deadline of a whole transaction, from the request's turn in the queue to COMMIT. */
  transactionTimeoutMs: number;
  /** Most bytes of results (as Postgres sends them) per transaction. */
  maxResultBytes: number;
  /** Extra attempts after a serialization failure or deadlock. */
  retries: number;
}

export interface RunOptions {
  isolation: Isolation;
  writerId: string | null;
}

export class TransactionRunner {
  private readonly opts: TransactionSettings;
  private readonly host: TransactionHost;
  private readonly slots: Slots;
  private readonly pools = new Map<string, pg.Pool>();
  /** What each pooled connection is fenced for (sql/transactions.ts fenceSession), as fence keys and tokens. */
  private readonly fencedFor = new WeakMap<pg.PoolClient, string>();
  private closed = false;

  constructor(host: TransactionHost, opts: TransactionSettings) {
    this.host = host;
    this.opts = opts;
    this.slots = new Slots(opts.maxConcurrent, Math.min(opts.maxConcurrent, opts.maxConcurrentPerKey));
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.pools.values()].map((p) => p.end().catch(() => {})));
    this.pools.clear();
  }

  /** Runs one fenced transaction as `keyName`'s login (null: open mode). Fences must have distinct keys. */
  async run(keyName: string | null, fences: readonly TxFence[], statements: readonly TxStatement[], opts: RunOptions): Promise<TxResult> {
    if (this.closed) throw new ConnectionLostError(new Error('the transaction runner is closed'));
    const sorted = [...fences].sort((a, b) => Buffer.compare(Buffer.from(a.fenceKey), Buffer.from(b.fenceKey)));
    const deadline = AbortSignal.timeout(this.opts.transactionTimeoutMs);
    const { logins, problems, capability } = await this.host.provision();
    const login = logins.get(keyName);
    if (!login) {
      throw new LoginUnavailableError(
        problems.get(keyName) ?? {
          login: '',
          message: `no client login for ${keyName === null ? 'open mode' : `key ${keyName}`}`,
          sql: [],
        },
      );
    }
    try {
      await this.slots.take(keyName ?? '', deadline);
    } catch {
      throw new TransactionTimeoutError(this.opts.transactionTimeoutMs);
    }
    // A raise's wait for older holders counts from here: the transaction's turn (Fence.raiseFor).
    const since = Date.now();
    try {
      const outcome = await this.staleWhenDeposed(sorted, () =>
        retryOnConflict(
          async () => {
            for (let fresh = 0, raised = false; ; fresh++) {
              try {
                return await this.attempt(login, capability, sorted, statements, opts.isolation, deadline);
              } catch (err) {
                if (err instanceof RaiseFirstError && !raised && !deadline.aborted) {
                  // A new leader's first transaction: raise its fences in a statement of the proxy's, then again.
                  raised = true;
                  await this.host.raiseFor(sorted, opts.writerId, { since }).catch((e: unknown) => {
                    if (e instanceof WriteOutcomeUnknownError) throw new CommitUnknownError(e, `${e.message}; none of the statements ran`);
                    throw sqlState(e) === LOCK_NOT_AVAILABLE ? new FenceBusyError(e) : isUnavailable(e) ? new ConnectionLostError(e) : e;
                  });
                  continue;
                }
                if (err instanceof RaiseFirstError) throw new FenceBusyError(err.cause);
                if (!(err instanceof SessionUnusableError) || fresh >= SESSION_RETRIES || deadline.aborted) throw err;
              }
            }
          },
          {
            retries: this.opts.retries,
            backoffMs: 10,
            retryable: (err) => isRetryable(err instanceof StatementError ? err.cause : err),
            stop: () => deadline.aborted,
          },
        ),
      );
      // A committed one is counted by this proxy, added to the counters in batches
      // (accepted-counts.ts); no counter row is held by a writer's transaction. A refused one is
      // recorded outside the retries above: the log retries its own statement as on every door,
      // and a stale token stays stale.
      if (!outcome.committed) await this.recordStale(outcome.stale, opts.writerId);
      else this.host.countAccepted(sorted.map((f) => f.fenceKey));
      return outcome;
    } finally {
      this.slots.give(keyName ?? '');
    }
  }

  /**
   * A connection lost before COMMIT was sent: if a fence of the transaction is now above its token,
   * a newer leader's raise ended it (raise.ts): the answer is stale, not "unavailable".
   */
  private async staleWhenDeposed(fences: readonly TxFence[], run: () => Promise<TxResult>): Promise<TxResult> {
    try {
      return await run();
    } catch (err) {
      if (!(err instanceof ConnectionLostError)) throw err;
      // Terminated by an administrator (57P01, what a raise does): give that raise its commit.
      const wait = sqlState(err.cause) === ADMIN_SHUTDOWN ? this.host.lockTimeoutMs : 0;
      const stale: { fenceKey: string; token: bigint; highestToken: bigint }[] = [];
      for (const f of fences) {
        const highest = await this.host.raisedAbove(f.fenceKey, f.token, wait).catch(() => null);
        if (highest !== null) stale.push({ fenceKey: f.fenceKey, token: f.token, highestToken: highest });
      }
      if (stale.length === 0) throw err;
      return { committed: false, stale };
    }
  }

  private poolFor(login: ClientLogin): pg.Pool {
    let pool = this.pools.get(login.login);
    if (!pool) {
      pool = new pg.Pool({
        ...clientConfig(this.opts.database, {
          login: { user: login.login, password: login.password },
          options: `-c synchronous_commit=on -c statement_timeout=${this.opts.statementTimeoutMs}`,
        }),
        max: this.opts.maxConcurrent,
        connectionTimeoutMillis: 5000,
        idleTimeoutMillis: 10_000,
        application_name: 'fencepost-client-sql',
      });
      // A connection that dies is dropped; the next checkout or query reports it.
      this.pools.set(login.login, leaveOldHosts(hearClientErrors(pool)));
    }
    return pool;
  }

  private async connect(login: ClientLogin): Promise<pg.PoolClient> {
    try {
      return await connectAs(this.host.owner, login, () => this.poolFor(login).connect());
    } catch (err) {
      throw new ConnectionLostError(err);
    }
  }

  private async attempt(
    login: ClientLogin,
    capability: string,
    fences: readonly TxFence[],
    statements: readonly TxStatement[],
    isolation: Isolation,
    deadline: AbortSignal,
  ): Promise<TxResult> {
    const client = await this.connect(login);
    const conn = (
      client as unknown as {
        connection: {
          stream: NodeJS.EventEmitter & { destroy(): void };
          on(e: 'readyForQuery', f: (m: { status: string }) => void): void;
          off(e: 'readyForQuery', f: (m: { status: string }) => void): void;
        };
      }
    ).connection;
    let status = 'I';
    let resultBytes = 0;
    let counting = false;
    let tooLarge = false;
    let lost = false;
    const onReady = (m: { status: string }) => (status = m.status);
    const onData = (chunk: Buffer) => {
      if (!counting) return;
      resultBytes += chunk.length;
      if (resultBytes > this.opts.maxResultBytes && !tooLarge) {
        tooLarge = true;
        conn.stream.destroy();
      }
    };
    const onError = () => (lost = true);
    const onDeadline = () => {
      lost = true;
      // Terminate the backend (a statement may have lifted its own timeouts), then drop the socket.
      const pid = (client as unknown as { processID: number | null }).processID;
      if (pid !== null) void this.host.owner.query(q.terminateBackend(pid)).catch(() => {});
      conn.stream.destroy();
    };
    client.on('error', onError);
    client.on('end', onError);
    conn.on('readyForQuery', onReady);
    conn.stream.on('data', onData);
    deadline.addEventListener('abort', onDeadline, { once: true });
    let reusable = false;
    let commitSent = false;
    /** Maps a failure: our own limits first, then a lost connection, then the statement's error. */
    const fail = async (err: unknown, index: number | null): Promise<never> => {
      // Once COMMIT is sent, only an answer from the server says whether it committed.
      if (deadline.aborted) throw commitSent ? new CommitUnknownError(err) : new TransactionTimeoutError(this.opts.transactionTimeoutMs);
      if (tooLarge) throw new ResultTooLargeError(this.opts.maxResultBytes);
      // Whether the connection is alive decides: an error on a live connection is the statement's
      // (whatever SQLSTATE it raised); a dead one means the backend or network failed.
      if (index === -1 && sqlState(err) !== LOCK_NOT_AVAILABLE && !isRetryable(err)) {
        // Not the fence's verdict: what the session carries (or a backend that died) broke the reset
        // or BEGIN. Nothing applied (no COMMIT was sent): drop the connection, try another.
        throw new SessionUnusableError(err);
      }
      const alive =
        !lost &&
        (await client.query(q.rollbackTransaction()).then(
          () => true,
          () => false,
        ));
      if (!alive) throw commitSent ? new CommitUnknownError(err) : new ConnectionLostError(err);
      reusable = true;
      if (index === -1) throw sqlState(err) === LOCK_NOT_AVAILABLE ? new FenceBusyError(err) : err;
      throw new StatementError(index, err);
    };
    try {
      if (deadline.aborted) throw new TransactionTimeoutError(this.opts.transactionTimeoutMs);
      try {
        const pid = (client as unknown as { processID: number | null }).processID;
        if (pid === null) throw new Error('the connection has no backend pid');
        const set = JSON.stringify(fences.map((f) => [f.fenceKey, f.token.toString()]));
        if (this.fencedFor.get(client) !== set) {
          // Fenced once per connection and set of fences (sql/transactions.ts fenceSession).
          this.fencedFor.delete(client);
          const unfenced = (await client.query(q.unfenceSession())) as unknown as pg.QueryResult<{ start?: string }>[];
          const start = unfenced.at(-1)?.rows[0]?.start ?? '';
          const { rows } = await client.query<{ ord: number; highest_token: string | null }>(
            q.fenceSession(
              fences.map((f) => ({ ...f, capability: sessionFenceCapability(capability, { pid, start }, f.fenceKey, f.token) })),
            ),
          );
          await client.query(q.endFenceSession());
          const highest = fences.map((_, i) => {
            const h = rows.find((r) => r.ord === i)?.highest_token ?? null;
            return h === null ? null : BigInt(h);
          });
          const stale = fences.flatMap((f, i) =>
            highest[i] !== null && highest[i]! > f.token ? [{ fenceKey: f.fenceKey, token: f.token, highestToken: highest[i]! }] : [],
          );
          reusable = true;
          if (stale.length > 0) return { committed: false, stale };
          // A fence absent or below its token: the caller raises it (raise.ts) and starts again.
          if (highest.some((h, i) => h === null || h < fences[i]!.token)) throw new RaiseFirstError(null);
          reusable = false;
          this.fencedFor.set(client, set);
        }
        await client.query(q.openClientTransaction(isolation, this.opts.statementTimeoutMs, this.opts.lockTimeoutMs, login.pgRole));
      } catch (err) {
        if (err instanceof RaiseFirstError) throw err;
        return await fail(err, -1);
      }
      const results: StatementResult[] = [];
      for (const [i, st] of statements.entries()) {
        let r: pg.QueryArrayResult;
        counting = true;
        try {
          // Extended protocol (queryMode, missing from @types/pg): Postgres refuses several
          // statements in one entry.
          const config: pg.QueryArrayConfig = { text: st.sql, values: st.params, rowMode: 'array', types: resultTypes };
          r = await client.query(Object.assign(config, { queryMode: 'extended' as const }));
        } catch (err) {
          return await fail(err, i);
        } finally {
          counting = false;
        }
        if (status !== 'T' || r.command === 'COMMIT' || r.command === 'ROLLBACK') {
          // COMMIT or ROLLBACK (… AND CHAIN too) ended the fenced transaction: send nothing more in
          // it, and never commit the one a chain opened (the fenced transaction is over).
          reusable = true;
          throw new TransactionEndedError(i);
        }
        results.push({ rowCount: r.rowCount ?? null, rows: toRows(r) });
      }
      const commit = watchCommit(client);
      try {
        commitSent = true;
        await client.query(q.sealAndCommit());
        commit.check();
      } catch (err) {
        if (err instanceof WriteOutcomeUnknownError) {
          reusable = true;
          throw new CommitUnknownError(err.cause, err.message);
        }
        return await fail(err, null);
      } finally {
        commit.stop();
      }
      reusable = true;
      return { committed: true, results };
    } finally {
      deadline.removeEventListener('abort', onDeadline);
      conn.stream.off('data', onData);
      conn.off('readyForQuery', onReady);
      client.off('error', onError);
      client.off('end', onError);
      // The next transaction on this connection resets the session first (openClientTransaction).
      if (reusable && !lost && !tooLarge && !deadline.aborted && status === 'I') client.release();
      else client.release(true);
    }
  }

  /** Counts the refusal on each stale fence and logs it; fills in each fence's highest token. */
  private async recordStale(stale: { fenceKey: string; token: bigint; highestToken: bigint }[], writerId: string | null): Promise<void> {
    const highest = await this.host.rejections.record(
      'transaction',
      stale.map((s) => ({ kind: 'transaction', fenceKey: s.fenceKey, key: null, token: s.token, writerId })),
    );
    for (const s of stale) s.highestToken = highest.get(s.fenceKey) ?? s.token;
  }
}
