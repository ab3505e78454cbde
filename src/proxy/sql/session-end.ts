// How a session ends when the writer did not end it, and what the writer hears: the backend's
// connection lost (with a commit in flight or not, or ended by a newer leader's raise), a
// transaction left idle past the proxy's limit, or a backend whose transaction state is not the one
// the planner predicted. The writer hears Postgres's words where they are the truth, and an
// ERROR + ReadyForQuery where libpq must keep the SQLSTATE (it keeps an error's only when the
// connection outlives it).
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { errorResponse, parseErrorFields, readyForQuery, type ErrorFields } from './wire/backend.ts';
import type { Replies } from './replies.ts';
import type { TransactionTally } from './tally.ts';
import {
  ADMIN_SHUTDOWN,
  CONNECTION_FAILURE,
  IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
  INTERNAL_ERROR,
  TRANSACTION_RESOLUTION_UNKNOWN,
} from '../../fence/index.ts';

/** How long a session whose backend a raise ended waits for the writer's next message, to answer it FP409. */
const DEPOSED_REPLY_WAIT_MS = 10 * 60_000;

/** What the relay lends the session's end. */
export interface EndingHost {
  client: Socket;
  backend: Socket;
  logger: Logger;
  replies: Replies;
  tally: TransactionTally;
  /** The backend's transaction status at its last ReadyForQuery ('I', 'T', 'E'). */
  status(): string;
  /** An ErrorResponse came since the last ReadyForQuery. */
  failed(): boolean;
  /** Writer's messages read and not yet sent on (held for the fencer); `drop` forgets them. */
  held(drop: boolean): number;
  /** Queues bytes for the writer. */
  push(bytes: Buffer): void;
  flushClient(): void;
  close(): void;
  closed(): boolean;
  /**
   * Why the backend went in the middle of a transaction, if the session can tell (a newer leader's
   * raise ended it: the writer gets that instead of a lost connection), else null.
   */
  lostReason?: (terminated: boolean) => Promise<ErrorFields | null>;
}

export class SessionEnd {
  /** The backend is gone; the writer is told why once lostReason() answers. */
  losing = false;
  /** The writer sent something meanwhile: answer it at once. */
  private spokeWhileLosing = false;
  /** A FATAL the backend sent outside any request, right before it went away. */
  private backendFatal: Buffer | null = null;
  /**
   * The writer was sent a FATAL in answer to its request (a raise's pg_terminate_backend mid-query):
   * it expects the connection to close.
   */
  writerHeardFatal = false;
  /** Ends a transaction the writer leaves idle too long (armIdle). */
  private idleTimer: NodeJS.Timeout | undefined;

  constructor(private readonly host: EndingHost) {}

  /** The writer spoke while the backend is gone and its answer not known yet: it is owed one (answerNextWith). */
  spoke(): void {
    this.spokeWhileLosing = true;
  }

  /** A FATAL outside any request (shutdown, or pg_terminate_backend by a raise): the backend takes nothing more. */
  backendSaidFatal(bytes: Buffer): void {
    this.backendFatal = bytes;
    this.backendLost();
  }

  disarmIdle(): void {
    clearTimeout(this.idleTimer);
  }

  /** The writer now owes the next message of a transaction it holds open: bound how long (`limitMs` 0: never). */
  armIdle(limitMs: number): void {
    const h = this.host;
    clearTimeout(this.idleTimer);
    if (limitMs <= 0 || h.status() === 'I' || h.replies.waiting || h.held(false) > 0) return;
    this.idleTimer = setTimeout(() => this.endIdleTransaction(limitMs), limitMs);
    this.idleTimer.unref();
  }

  backendLost(): void {
    const h = this.host;
    if (h.closed() || this.losing) return;
    this.losing = true;
    const inFlight = h.replies.waiting || h.status() !== 'I';
    // A request of the writer's that may commit (planner.ts mayCommit: a COMMIT, a statement of an
    // implicit transaction), not answered by its ReadyForQuery nor failed: it may have committed.
    const commitInFlight = !h.failed() && h.replies.commitInFlight;
    h.logger.warn({ inFlight, commitInFlight }, 'SQL session: the database connection was lost');
    if (commitInFlight) {
      // No raise's FP409 here: a backend ended while committing (waiting for the synchronous
      // standby, say) has committed locally.
      h.tally.end('error');
      this.answerLost({
        severity: 'ERROR',
        code: TRANSACTION_RESOLUTION_UNKNOWN,
        message: 'the database connection was lost while a commit was in flight: the transaction may or may not have committed',
        hint: 'read back what it wrote before retrying it',
      });
      return;
    }
    const writerWaits = h.replies.writerWaits;
    const finish = (reason: ErrorFields | null) => {
      if (h.closed()) return;
      // A reason is a newer leader's raise (FP409): counted as rejected by onStale, not here.
      if (reason !== null) h.tally.forget();
      h.tally.end('error');
      if (this.writerHeardFatal) {
        // The writer's request was answered with the FATAL (Postgres's own words, a raise's
        // pg_terminate_backend mid-query): the connection ends now, as it would straight to Postgres.
        h.flushClient();
        this.endWith(Buffer.alloc(0));
        return;
      }
      if (reason !== null && !h.client.destroyed) {
        // Told as the answer to the writer's next message (a paused writer reads it as its
        // COMMIT's), as an ERROR and a ReadyForQuery. The message after that ends the session.
        h.flushClient();
        this.answerNextWith(Buffer.concat([errorResponse({ ...reason, severity: 'ERROR' }), readyForQuery('I')]), true);
        return;
      }
      if (reason === null && writerWaits) {
        this.answerLost({
          severity: 'ERROR',
          code: CONNECTION_FAILURE,
          message: 'the database connection was lost',
          detail: 'nothing of the open transaction committed (no commit was in flight)',
        });
        return;
      }
      if (reason === null && this.backendFatal !== null) h.push(this.backendFatal);
      h.flushClient();
      if (!h.client.destroyed) {
        h.client.end(
          errorResponse(
            reason ?? {
              severity: 'FATAL',
              code: CONNECTION_FAILURE,
              message: 'the database connection was lost',
              detail: inFlight ? 'nothing of the open transaction committed (no commit was in flight)' : undefined,
            },
          ),
        );
      }
      h.close();
    };
    // Only a transaction that was open and not committing can have been ended by a raise.
    // 57P01: terminated by an administrator, as a raise ends the transactions that hold its fence.
    const terminated = this.backendFatal !== null && parseErrorFields(this.backendFatal.subarray(5)).get('C') === ADMIN_SHUTDOWN;
    if (inFlight && h.lostReason) h.lostReason(terminated).then(finish, () => finish(null));
    else finish(null);
  }

  /** The backend's transaction state is not the planner's: end the session, never go on in a transaction the fence may not cover. */
  lostTrack(predicted: 'I' | 'T'): void {
    const h = this.host;
    const reported = h.status();
    h.logger.error({ predicted, reported }, "SQL session closed: the backend's transaction state is not what the proxy predicted");
    h.flushClient();
    if (!h.client.destroyed) {
      h.client.end(
        errorResponse({
          severity: 'FATAL',
          code: INTERNAL_ERROR,
          message: "the fencepost SQL endpoint lost track of the session's transaction state; the session is closed",
          detail:
            reported === 'T'
              ? 'the open transaction was rolled back'
              : 'statements after an unforeseen end of a transaction may have run and committed',
        }),
      );
    }
    h.close();
  }

  /**
   * The backend went while the writer waits for an answer: `error` answers it at once, with a
   * ReadyForQuery; the writer's next message hears that the session is gone.
   */
  private answerLost(error: ErrorFields): void {
    const h = this.host;
    h.flushClient();
    if (h.client.destroyed) {
      h.close();
      return;
    }
    h.client.write(Buffer.concat([errorResponse(error), readyForQuery('I')]));
    this.answerNextWith(
      errorResponse({ severity: 'FATAL', code: CONNECTION_FAILURE, message: "this session's database connection was lost: reconnect" }),
    );
  }

  /**
   * The writer held its transaction open past the limit (a paused writer, say): the backend goes,
   * so the transaction rolls back and holds no fence; the writer hears it at its next message
   * (FP409 if a newer leader has raised the fence by then, else 25P03).
   */
  private endIdleTransaction(limitMs: number): void {
    const h = this.host;
    if (h.closed() || this.losing) return;
    this.losing = true;
    h.logger.info({ limitMs }, 'SQL session: a transaction idle past the limit was ended');
    const idle: ErrorFields = {
      severity: 'FATAL',
      code: IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
      message: `terminating the session: its transaction was idle longer than ${limitMs} ms (FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS)`,
      detail: 'the transaction rolled back: nothing of it was applied',
    };
    h.flushClient();
    this.answerNextWith(async () => {
      const stale = (await h.lostReason?.(false).catch(() => null)) ?? null;
      // Stale: counted as rejected (onStale). Else ended for the writer's idleness: invalid.
      if (stale !== null) h.tally.forget();
      h.tally.end('invalid');
      return errorResponse(stale ?? idle);
    });
  }

  /** Writes `bytes` and ends the writer's connection once they are out (a destroy would drop them), then closes. */
  private endWith(bytes: Buffer): void {
    const h = this.host;
    if (h.client.destroyed) {
      h.close();
      return;
    }
    const timer = setTimeout(() => h.close(), 2000);
    timer.unref();
    h.client.end(bytes, () => {
      clearTimeout(timer);
      h.close();
    });
  }

  /** The backend is gone: answer the writer's next message (or its leaving) with `reply`, then close. */
  private answerNextWith(reply: Buffer | (() => Promise<Buffer>), thenLost = false): void {
    const h = this.host;
    h.backend.destroy();
    let answered = false;
    const done = () => {
      if (answered) return;
      answered = true;
      clearTimeout(timer);
      if (thenLost && !h.client.destroyed && !h.client.readableEnded) {
        // An answer that keeps the connection: the next message hears that the session is gone.
        h.client.write(reply as Buffer);
        this.answerNextWith(
          errorResponse({
            severity: 'FATAL',
            code: CONNECTION_FAILURE,
            message: "this session's database connection was ended by a newer leader's raise: reconnect",
          }),
        );
        return;
      }
      void (typeof reply === 'function' ? reply() : Promise.resolve(reply)).then((bytes) => this.endWith(bytes));
    };
    // A writer that never comes back is not waited for past this.
    const timer = setTimeout(done, DEPOSED_REPLY_WAIT_MS);
    timer.unref();
    h.client.removeAllListeners('data');
    h.client.once('data', done);
    h.client.once('end', done);
    h.client.resume();
    // Spoken already: after the loss, or before it and not yet sent on (held for the fencer).
    if (this.spokeWhileLosing || h.held(false) > 0) {
      this.spokeWhileLosing = false;
      h.held(true);
      done();
    }
  }
}
