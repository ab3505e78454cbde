// The errors the fence raises to its callers, in one place: what a fenced SQL transaction
// (transaction.ts) fails with, as POST /v1/transactions answers it (the writer's statement
// failed, the transaction was ended by a statement, a result or the deadline was too large, the
// connection was lost before COMMIT so nothing applied, COMMIT's fate is unknown, the fence stayed
// locked, the key's login is unusable); a write whose commit is unknown; a fence row held by a
// prepared transaction; no writable host; a batch that committed in part; a refused protect.
import pg from 'pg';
import { LOCK_NOT_AVAILABLE, SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION } from './sqlstate.ts';
import { coerceError } from './pg-errors.ts';
import type { LoginProblem } from './client-logins.ts';

/** A statement (index; null for COMMIT) failed on a live connection; `cause` is the pg error. Rolled back. */
/** A prepared transaction found holding a fence row (prepared-holders.ts). */
export interface PreparedHolder {
  fenceKey: string;
  /** The prepared transaction's gid (pg_prepared_xacts.gid). */
  gid: string;
}

export class StatementError extends Error {
  readonly index: number | null;
  constructor(index: number | null, cause: unknown) {
    super(`${index === null ? 'COMMIT' : `statement ${index}`} failed: ${coerceError(cause).message}`, { cause });
    this.name = 'StatementError';
    this.index = index;
  }
}

/** Statement `index` ended the transaction (COMMIT, ROLLBACK, … AND CHAIN): what it committed stands, nothing after it did. */
export class TransactionEndedError extends Error {
  readonly index: number;
  constructor(index: number) {
    super(
      `statements[${index}] ended the transaction: the fence and the statements before it are as that statement left them; nothing after it was applied`,
    );
    this.name = 'TransactionEndedError';
    this.index = index;
  }
}

/** The results passed `maxResultBytes`; the connection was dropped; nothing applied. */
export class ResultTooLargeError extends Error {
  constructor(readonly limit: number) {
    super(`the results passed ${limit} bytes; nothing applied`);
    this.name = 'ResultTooLargeError';
  }
}

/** The whole transaction ran past its deadline; the backend was terminated; nothing applied. */
export class TransactionTimeoutError extends Error {
  constructor(readonly limitMs: number) {
    super(`the transaction ran past ${limitMs} ms; nothing applied`);
    this.name = 'TransactionTimeoutError';
  }
}

/** The connection was lost before COMMIT was sent (e.g. the backend died): nothing applied. */
export class ConnectionLostError extends Error {
  constructor(cause: unknown) {
    super('the database connection was lost before COMMIT; nothing applied', { cause });
    this.name = 'ConnectionLostError';
  }
}

/**
 * The first round trip failed for a reason of the pooled session's, not of the fence (e.g. a
 * setting an earlier transaction left made the reset time out): the connection was dropped and
 * nothing applied. The runner tries again on another connection.
 */
export class SessionUnusableError extends ConnectionLostError {
  constructor(cause: unknown) {
    super(cause);
    this.message = 'the pooled database session could not be reset and was closed; nothing applied';
    this.name = 'SessionUnusableError';
  }
}

/** The write or COMMIT was sent, and its answer did not say it committed durably: it may or may not have. */
export class WriteOutcomeUnknownError extends Error {
  constructor(cause: unknown, message = 'the database connection was lost after the write was sent: it may or may not have committed') {
    super(message, { cause });
    this.name = 'WriteOutcomeUnknownError';
  }
}

/**
 * COMMIT was sent and not confirmed: the connection was lost (or the deadline ended the backend)
 * before its answer, or Postgres answered with a warning that the synchronous standby may not have
 * it (commit-outcome.ts). Or the raise before the statements was (they did not run).
 */
export class CommitUnknownError extends WriteOutcomeUnknownError {
  constructor(cause: unknown, message = 'the database connection was lost during COMMIT; the transaction may or may not have committed') {
    super(cause, message);
    this.name = 'CommitUnknownError';
  }
}

/** A fence of the transaction is locked by another transaction past the lock timeout: nothing applied. */
export class FenceBusyError extends Error {
  /** When the holder is a prepared transaction (which no retry outwaits): which, on which fence. */
  readonly heldBy: FenceHeldByPreparedError | null;
  constructor(cause: unknown) {
    const heldBy = cause instanceof FenceHeldByPreparedError ? cause : null;
    super(
      heldBy
        ? `${heldBy.message}; nothing applied`
        : 'a fence of the transaction is locked by another transaction; nothing applied, safe to retry',
      { cause },
    );
    this.name = 'FenceBusyError';
    this.heldBy = heldBy;
  }
}

/** The key's client login does not exist or is unsafe (see the proxy log for the SQL that fixes it). */
export class LoginUnavailableError extends Error {
  constructor(readonly problem: LoginProblem) {
    super(problem.message);
    this.name = 'LoginUnavailableError';
  }
}

/**
 * A fence row held by a prepared transaction past the lock timeout. Its `code` stays 55P03, so
 * whatever handles a lock timeout handles it; it adds who holds the row and what releases it.
 */
export class FenceHeldByPreparedError extends Error {
  readonly code = LOCK_NOT_AVAILABLE;
  readonly fenceKey: string;
  readonly preparedTransaction: string;
  constructor(holder: PreparedHolder, cause: unknown) {
    const gid = pg.escapeLiteral(holder.gid);
    super(`fence ${holder.fenceKey} is held by prepared transaction ${gid} (ROLLBACK PREPARED ${gid} releases it)`, { cause });
    this.name = 'FenceHeldByPreparedError';
    this.fenceKey = holder.fenceKey;
    this.preparedTransaction = holder.gid;
  }
}

/**
 * No host of the list is the one target_session_attrs asks for, or the host connected to turned
 * out not to be. SQLSTATE 08001 (sqlclient_unable_to_establish_sqlconnection): nothing was sent,
 * so the write did not commit and is safe to retry (503 `unavailable`).
 */
export class NoWritableHostError extends Error {
  readonly code = SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION;
  constructor(message: string) {
    super(message);
    this.name = 'NoWritableHostError';
  }
}

export class ProtectError extends Error {
  constructor(
    message: string,
    /** SQL an operator may run to make it possible (empty when none helps). */
    readonly sql: string[] = [],
  ) {
    super(message);
    this.name = 'ProtectError';
  }
}
