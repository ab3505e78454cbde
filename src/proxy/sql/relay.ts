// The session's plumbing: reads the writer's messages, sends what the planner decides for each, and
// sorts the backend's responses into the writer's and the proxy's.
//
// Each message sent to the backend has an expected response, tagged injected or the writer's; the
// responses of injected messages are swallowed (notices included), the writer's are forwarded as
// they came. An ErrorResponse outside a simple Query makes the backend skip to the next Sync: the
// expectations up to it are dropped, and until the writer's Sync comes (it may come in a later
// write) nothing more is expected. A new group is held until the previous one's ReadyForQuery says
// whether the session is idle; one that would start a transaction also waits for the gate (the
// forgery guard and the raise, gate.ts).
//
// What the planner believes follows what the backend did, never what was sent: a statement's or
// portal's kind counts once its ParseComplete / BindComplete / CloseComplete arrives (a refused or
// skipped message changes nothing), and every ReadyForQuery answering the writer's Sync or Query is
// checked against the state the planner predicted for it. A backend in a transaction block the
// planner did not predict, or idle when it predicted a block and nothing failed, means a
// transaction the fence may not cover: the session ends (FATAL XX000), which rolls back whatever
// is open, instead of going on.
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import {
  MessageReader,
  commandTag,
  readyForQuery,
  type ErrorFields,
  dataRowTexts,
  decodeClient,
  encode,
  errorResponse,
  message,
  parameterOf,
  parseErrorFields,
  type ClientMessage,
  type Frame,
} from './framing.ts';
import { staleDetail, STALE_TOKEN } from './fence.ts';
import { DURABILITY_UNSAFE, GUARD_UNAVAILABLE, INVALID_FENCE_SETTING, RAISE_FIRST } from '../../fence/codes.ts';
import type { Expect, Kind, Planner, Step } from './planner.ts';
import type { Backend } from './backend.ts';
import {
  ADMIN_SHUTDOWN,
  CONNECTION_FAILURE,
  IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
  INTERNAL_ERROR,
  INVALID_SQL_STATEMENT_NAME,
  LOCK_NOT_AVAILABLE,
  OBJECT_NOT_IN_PREREQUISITE_STATE,
  PROTOCOL_VIOLATION,
  QUERY_CANCELED,
  READ_ONLY_SQL_TRANSACTION,
  TRANSACTION_RESOLUTION_UNKNOWN,
} from '../../fence/sqlstate.ts';

/**
 * How a fenced transaction ended, as far as the session sees it: committed (accepted), failed on
 * an error (invalid), rolled back by the writer or left open when it went (rolled_back), or its
 * database connection lost (error; a COMMIT in flight then may or may not have committed).
 */
export type TransactionEnd = 'accepted' | 'invalid' | 'rolled_back' | 'error';

export interface StaleRefusal {
  fenceKey: string;
  token: bigint;
  highestToken: bigint | null;
}

/** What the relay asks before a transaction starts at idle. */
export interface Gate {
  /** May it start now? */
  ready(): boolean;
  /** Get ready; the relay is resumed (resume()) when it is. */
  start(): void;
  /** The writer's statement text, before it is planned. */
  noteText(text: string): void;
  /** The session may have lost its fence (`setUp`: and its setup): decide again before the next transaction. */
  invalidate(setUp: boolean): void;
  /** A RESET ran: the settings may be their startup values again. */
  noteReset(): void;
}

export interface RelayOptions {
  logger: Logger;
  /** null: none. */
  gate: Gate | null;
  onStale: (refusal: StaleRefusal) => void;
  /** Each fenced transaction's end, once, with its fence key (metrics: fencepost_writes_total{door="sql"}; accepted counts). */
  onTransactionEnd?: (end: TransactionEnd, fenceKey: string) => void;
  /** A transaction whose fence failed for a reason other than a stale token (FENCE_ERROR_OUTCOMES). */
  onFenceError?: (outcome: 'error' | 'invalid') => void;
  onClose: () => void;
  /**
   * The backend went away in the middle of a transaction: why, if the session can tell (a newer
   * leader's raise ended it: the writer gets that instead of a lost connection), else null.
   */
  lostReason?: (terminated: boolean) => Promise<ErrorFields | null>;
  /**
   * A transaction left idle this long (after a ReadyForQuery in a block, nothing of the writer's
   * since) is ended by the proxy, whatever timeouts the writer set (0: never).
   */
  idleInTransactionMs?: number;
}

interface Pending extends Expect {
  /** query (injected): sees its messages. */
  capture?: (f: Frame) => void;
  /** Called at its ReadyForQuery. */
  onReady?: () => void;
  /** query: the fence after a lone BEGIN failed (see undoBeginOnFenceError). */
  fenceFailed?: boolean;
  /** How many CopyDone/CopyFail of the writer's had gone to the backend when this was sent. */
  copyEndsAt?: number;
}

/**
 * COPY FROM STDIN, as the backend runs it: from its CopyInResponse it reads only CopyData, CopyDone
 * and CopyFail, ignores Flush and Sync, and takes any other message as an error it cannot be matched
 * with. So while the writer's copy stream is open its copy messages, Flushes and Syncs go straight
 * through (never held for an answer that comes only after the copy ends), and anything else ends
 * the session. A COPY started by an extended-protocol Execute still needs a Sync after the copy
 * (libpq sends one after CopyDone): that Sync answers the group's first one, which the backend
 * ignored.
 */
const NOT_COPY_DATA = 'a message other than CopyData, CopyDone, CopyFail, Flush or Sync during COPY FROM STDIN';

/**
 * A fence statement's errors other than stale, as the HTTP door counts its answers: the fence could
 * not be checked (the guard or the durability check refused, the fence row stayed locked, a
 * timeout: `error`), or the session's fence settings are malformed (`invalid`).
 */
const FENCE_ERROR_OUTCOMES: Readonly<Record<string, 'error' | 'invalid'>> = {
  [RAISE_FIRST]: 'error',
  [GUARD_UNAVAILABLE]: 'error',
  [DURABILITY_UNSAFE]: 'error',
  [LOCK_NOT_AVAILABLE]: 'error',
  [QUERY_CANCELED]: 'error',
  [INVALID_FENCE_SETTING]: 'invalid',
};

/** SQLSTATE of the session's end when the backend's transaction state is not what the planner predicted. */
const ROLLBACK = encode({ type: 'query', text: 'ROLLBACK' });
const FLUSH = message('H');

/** How long a session whose backend a raise ended waits for the writer's next message, to answer it FP409. */
const DEPOSED_REPLY_WAIT_MS = 10 * 60_000;
const READ_ONLY_HINT =
  "on the fencepost SQL endpoint a session writes only with a fencing token: SET fencepost.token = '<token>' and fencepost.fence_key = '<fence key>' (or -c fencepost.token=… -c fencepost.fence_key=… in the startup options); without one every transaction is read-only";

/** A writer's "read-only transaction" error (25006) with a hint naming fencepost.token, unless it has a hint of its own. */
function withReadOnlyHint(bytes: Buffer): Buffer {
  const fields = parseErrorFields(bytes.subarray(5));
  if (fields.get('C') !== READ_ONLY_SQL_TRANSACTION || fields.has('H')) return bytes;
  fields.set('H', READ_ONLY_HINT);
  const parts: Buffer[] = [];
  for (const [code, value] of fields) parts.push(Buffer.from(code, 'latin1'), Buffer.from(`${value}\u0000`, 'utf8'));
  parts.push(Buffer.from([0]));
  return message('E', ...parts);
}

/**
 * Does a ReadyForQuery's status agree with the planner's prediction? A block ('T') must have been
 * predicted; idle ('I') when a block was predicted only if something failed (the rest was skipped);
 * a failed block ('E') commits nothing, and what the writer sends next is planned from it.
 */
function predictionHolds(predicted: 'I' | 'T', reported: string, failed: boolean): boolean {
  if (reported === 'T') return predicted === 'T';
  if (reported === 'I') return predicted === 'I' || failed;
  return true;
}

export class Relay {
  private status = 'I';
  private readonly queue: Pending[] = [];
  private pendingReady = 0;
  private readonly clientFrames: { frame: Frame; msg: ClientMessage }[] = [];
  private toBackend: Buffer[] = [];
  private toClient: Buffer[] = [];
  private holding = false;
  /** The session is being fenced for its startup settings (session.ts): the writer's messages wait. */
  private startupHold = false;
  /** An error in an extended group whose Sync is not sent yet: the backend skips what comes until then. */
  private skipping = false;
  /** An ErrorResponse came since the last ReadyForQuery. */
  private failed = false;
  /** The backend's socket buffer is full: stop reading the writer until it drains. */
  private backendBlocked = false;
  private closed = false;
  /** The backend is gone; the writer is told why once lostReason() answers. */
  private losing = false;
  /** The writer sent something meanwhile: answer it at once. */
  private spokeWhileLosing = false;
  /** Ends a transaction the writer leaves idle too long (armIdleInTransaction). */
  private idleTimer: NodeJS.Timeout | undefined;
  /** A FATAL the backend sent outside any request, right before it went away. */
  private backendFatal: Buffer | null = null;
  /**
   * The writer was sent a FATAL in answer to its request (a raise's pg_terminate_backend mid-query):
   * it expects the connection to close.
   */
  private writerHeardFatal = false;
  /** A Flush of the proxy's went to the backend for a Query waiting inside an open group. */
  private flushAsked = false;
  /**
   * Counting fenced transactions the way the database does: fence_session_bound() adds a
   * pending_counts row when a transaction passes the fence with a token (the fence statement then
   * returns no row: CommandComplete "SELECT 0"; a session without a token gets "SELECT 1"), and
   * that row counts once the transaction commits. So a transaction is `fenced` from that
   * CommandComplete; it committed at a CommandComplete "COMMIT" of the writer's (the backend sends
   * it after the commit; a failed block's COMMIT answers "ROLLBACK"), or at a ReadyForQuery 'I'
   * that ends an implicit transaction with no error and no ROLLBACK in it (`spoiled`). A
   * ReadyForQuery 'T' clears `spoiled` (ROLLBACK TO SAVEPOINT answers "ROLLBACK" too, and revives a
   * failed block); 'E' sets it.
   */
  private fenced = false;
  /** The fence key of the fenced transaction open now. */
  private fencedKey = '';
  private spoiled: 'invalid' | 'rolled_back' | null = null;
  /** CopyDone and CopyFail messages of the writer's sent to the backend so far. */
  private copyEnds = 0;
  /** The backend is in COPY IN (CopyInResponse, no CommandComplete or error since). */
  private copyActive = false;
  /** The writer's copy stream is open: the backend is in COPY IN and the writer has not ended it. */
  private copyStream: { extended: boolean } | null = null;
  /** The backend needs one more Sync for a COPY started by an Execute (see NOT_COPY_DATA). */
  private owedSync = false;

  /** The value of each reported setting as the writer last heard it (ParameterStatus). */
  private readonly told = new Map<string, string>();

  constructor(
    private readonly client: Socket,
    private readonly clientReader: MessageReader,
    private readonly backend: Backend,
    private readonly planner: Planner,
    private readonly opts: RelayOptions,
  ) {
    for (const b of backend.parameterStatus) {
      const { name, value } = this.noteParameter(b.subarray(5));
      this.told.set(name, value);
    }
  }

  /** Starts relaying (bytes already framed by either reader are processed first). */
  start(): void {
    this.client.on('data', (chunk: Buffer) => this.onClientData(chunk));
    this.backend.socket.on('data', (chunk: Buffer) => this.onBackendData(chunk));
    this.client.on('close', () => this.close());
    this.client.on('error', () => this.close());
    this.backend.socket.on('error', () => this.onBackendLost());
    this.backend.socket.on('close', () => this.onBackendLost());
    this.client.on('drain', () => this.backend.socket.resume());
    this.backend.socket.on('drain', () => {
      this.backendBlocked = false;
      if (!this.holding) this.client.resume();
    });
    this.onClientData(Buffer.alloc(0));
    this.onBackendData(Buffer.alloc(0));
  }

  /** Holds the writer's messages until releaseStartup(): the session's startup fence comes first. */
  holdForStartup(): void {
    this.startupHold = true;
  }

  releaseStartup(): void {
    this.startupHold = false;
  }

  /** Goes on with the writer's messages held for the gate. */
  resume(): void {
    if (this.closed || this.losing) return; // what the gate held is answered by answerNextWith
    this.pumpClient();
    this.flushClient();
  }

  /** A Query of the proxy's ahead of the writer's next message: `onRow` sees its rows, `then` runs at its ReadyForQuery. */
  query(sql: string, onRow: (values: string[]) => void, then: () => void, onError?: (fields: Map<string, string>) => void): void {
    this.toBackend.push(encode({ type: 'query', text: sql }));
    this.expect({
      kind: 'query',
      injected: true,
      forwardReady: false,
      capture: (f) => {
        if (f.type === 'D') onRow(dataRowTexts(f.body));
        else if (f.type === 'E') onError?.(parseErrorFields(f.body));
      },
      onReady: then,
    });
    this.flushBackend();
  }

  close(): void {
    if (this.closed) return;
    this.endFenced(this.losing ? 'error' : 'rolled_back');
    this.closed = true;
    clearTimeout(this.idleTimer);
    this.backend.socket.destroy();
    // A last message written with end() (an error the writer must read: libpq reads it only after
    // its own write) goes out before the socket does; a destroy would drop it.
    // Bytes the writer still sends are read and dropped meanwhile: closing with them unread would
    // reset the connection, and the writer's side could drop the error before reading it.
    if (this.client.writableEnded && !this.client.destroyed) {
      const timer = setTimeout(() => this.client.destroy(), 2000);
      timer.unref();
      this.client.removeAllListeners('data');
      this.client.on('data', () => {});
      this.client.once('close', () => clearTimeout(timer));
      this.client.resume();
    } else {
      this.client.destroy();
    }
    this.opts.onClose();
  }

  /** The writer went away or broke the protocol; the backend rolls back what was open. */
  private fail(reason: string, err?: unknown): void {
    if (this.closed) return;
    this.opts.logger.warn({ err }, `SQL session closed: ${reason}`);
    if (!this.client.destroyed) this.client.end(errorResponse({ severity: 'FATAL', code: PROTOCOL_VIOLATION, message: reason }));
    this.close();
  }

  private onBackendLost(): void {
    if (this.closed || this.losing) return;
    this.losing = true;
    const inFlight = this.queue.length > 0 || this.status !== 'I';
    // A request of the writer's that may commit (planner.ts mayCommit: a COMMIT, a statement of an
    // implicit transaction), not answered by its ReadyForQuery nor failed: it may have committed.
    const commitInFlight = !this.failed && this.queue.some((e) => !e.injected && e.mayCommit === true);
    this.opts.logger.warn({ inFlight, commitInFlight }, 'SQL session: the database connection was lost');
    if (commitInFlight) {
      // No raise's FP409 here: a backend ended while committing (waiting for the synchronous
      // standby, say) has committed locally.
      this.endFenced('error');
      this.answerLost({
        severity: 'ERROR',
        code: TRANSACTION_RESOLUTION_UNKNOWN,
        message: 'the database connection was lost while a commit was in flight: the transaction may or may not have committed',
        hint: 'read back what it wrote before retrying it',
      });
      return;
    }
    const writerWaits = this.queue.some((e) => !e.injected);
    const finish = (reason: ErrorFields | null) => {
      if (this.closed) return;
      // A reason is a newer leader's raise (FP409): counted as rejected by onStale, not here.
      if (reason !== null) this.fenced = false;
      this.endFenced('error');
      if (this.writerHeardFatal) {
        // The writer's request was answered with the FATAL (Postgres's own words, a raise's
        // pg_terminate_backend mid-query): the connection ends now, as it would straight to Postgres.
        this.flushClient();
        this.endWith(Buffer.alloc(0));
        return;
      }
      if (reason !== null && !this.client.destroyed) {
        // Told as the answer to the writer's next message (a paused writer reads it as its
        // COMMIT's), as an ERROR and a ReadyForQuery: libpq (psycopg2) keeps the SQLSTATE of an
        // error only when the connection outlives it. The message after that ends the session.
        this.flushClient();
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
      if (reason === null && this.backendFatal !== null) this.toClient.push(this.backendFatal);
      this.flushClient();
      if (!this.client.destroyed) {
        this.client.end(
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
      this.close();
    };
    // Only a transaction that was open and not committing can have been ended by a raise.
    // 57P01: terminated by an administrator, as a raise ends the transactions that hold its fence.
    const terminated = this.backendFatal !== null && parseErrorFields(this.backendFatal.subarray(5)).get('C') === ADMIN_SHUTDOWN;
    if (inFlight && this.opts.lostReason) this.opts.lostReason(terminated).then(finish, () => finish(null));
    else finish(null);
  }

  /**
   * The backend went while the writer waits for an answer: `error` answers it at once, with a
   * ReadyForQuery (libpq keeps the SQLSTATE of an error only when the connection outlives it);
   * the writer's next message hears that the session is gone.
   */
  private answerLost(error: ErrorFields): void {
    this.flushClient();
    if (this.client.destroyed) {
      this.close();
      return;
    }
    this.client.write(Buffer.concat([errorResponse(error), readyForQuery('I')]));
    this.answerNextWith(
      errorResponse({ severity: 'FATAL', code: CONNECTION_FAILURE, message: "this session's database connection was lost: reconnect" }),
    );
  }

  /** Writes `bytes` and ends the writer's connection once they are out (a destroy would drop them), then closes. */
  private endWith(bytes: Buffer): void {
    if (this.client.destroyed) {
      this.close();
      return;
    }
    const timer = setTimeout(() => this.close(), 2000);
    timer.unref();
    this.client.end(bytes, () => {
      clearTimeout(timer);
      this.close();
    });
  }

  /** The backend is gone: answer the writer's next message (or its leaving) with `reply`, then close. */
  private answerNextWith(reply: Buffer | (() => Promise<Buffer>), thenLost = false): void {
    this.backend.socket.destroy();
    let answered = false;
    const done = () => {
      if (answered) return;
      answered = true;
      clearTimeout(timer);
      if (thenLost && !this.client.destroyed && !this.client.readableEnded) {
        // An answer that keeps the connection: the next message hears that the session is gone.
        this.client.write(reply as Buffer);
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
    this.client.removeAllListeners('data');
    this.client.once('data', done);
    this.client.once('end', done);
    this.client.resume();
    // Spoken already: after the loss, or before it and not yet sent on (held for the gate).
    if (this.spokeWhileLosing || this.clientFrames.length > 0) {
      this.spokeWhileLosing = false;
      this.clientFrames.length = 0;
      done();
    }
  }

  private noteParameter(body: Buffer): { name: string; value: string } {
    const p = parameterOf(body);
    this.planner.noteParameter(p.name, p.value);
    return p;
  }

  // ---- writer → backend -------------------------------------------------------------------------

  private onClientData(chunk: Buffer): void {
    if (this.closed) return;
    if (this.losing) {
      // The backend is gone and the writer's answer not known yet: it is owed one (answerNextWith).
      if (chunk.length > 0) this.spokeWhileLosing = true;
      return;
    }
    clearTimeout(this.idleTimer);
    try {
      if (chunk.length > 0) this.clientReader.push(chunk);
      for (let f = this.clientReader.next(); f !== null; f = this.clientReader.next())
        this.clientFrames.push({ frame: f, msg: decodeClient(f) });
    } catch (err) {
      this.fail('malformed message from the client', err);
      return;
    }
    this.pumpClient();
  }

  private pumpClient(): void {
    if (this.startupHold) {
      this.holding = this.clientFrames.length > 0;
      if (this.holding) this.client.pause();
      return;
    }
    let i = 0;
    while (i < this.clientFrames.length && !this.closed) {
      const { frame, msg } = this.clientFrames[i]!;
      if ((this.copyStream !== null || this.owedSync) && msg.type !== 'copy') {
        if (msg.type === 'sync' || msg.type === 'flush') {
          // Ignored by the backend in COPY IN; after it, the Sync the copy's group still needs.
          i++;
          this.toBackend.push(frame.bytes);
          if (msg.type === 'sync' && this.copyStream === null) this.owedSync = false;
          continue;
        }
        this.flushBackend();
        this.fail(
          this.copyStream !== null
            ? NOT_COPY_DATA
            : 'a message other than Sync after the copy data of a COPY FROM STDIN started by Execute',
        );
        return;
      }
      if (this.pendingReady > 0 && this.planner.opensGroup(msg)) break;
      if (msg.type === 'query' && this.planner.inGroup()) {
        // A Query inside an open group (asyncpg: Parse/Describe/Flush, then a Query): planned once
        // the group's answers are in, as asyncpg waits for them too. After an error the backend
        // skips everything but Sync, a Query too, with no answer: so does the proxy.
        if (this.queue.length > 0) {
          // The backend holds its answers until a Flush or Sync: ask for them (a Flush answers nothing).
          if (!this.flushAsked) this.toBackend.push(FLUSH);
          this.flushAsked = true;
          break;
        }
        this.flushAsked = false;
        if (this.skipping) {
          i++;
          continue;
        }
      }
      const gate = this.opts.gate;
      if (gate && (this.status === 'I' || this.planner.holdsBegin()) && this.planner.startsTransaction(msg) && !gate.ready()) {
        // Before a transaction starts (only between ReadyForQuery and the next message: idle, or
        // a BEGIN the proxy answered and holds).
        gate.start();
        break;
      }
      if (msg.type === 'bind' && this.status === 'I' && this.pendingReady === 0) {
        // A lone BEGIN group: answered here, held for the next message (planner.ts holdExtendedBegin).
        const next = this.clientFrames.slice(i, i + 4);
        const held = this.planner.holdExtendedBegin(
          next.map((f) => f.msg),
          next.map((f) => f.frame.bytes),
          { status: this.status, awaiting: this.queue.length > 0 },
        );
        if (held !== null) {
          i += held.taken;
          this.answerBegin(held.reply);
          continue;
        }
      }
      i++;
      if (gate && (msg.type === 'query' || msg.type === 'parse')) gate.noteText(msg.text);
      this.apply(frame, this.planner.plan(msg, { status: this.status, awaiting: this.queue.length > 0 }));
      if (frame.type === 'c' || frame.type === 'f') this.endCopyStream();
    }
    this.clientFrames.splice(0, i);
    this.holding = this.clientFrames.length > 0;
    this.flushBackend();
    if (this.holding || this.backendBlocked) this.client.pause();
    else if (!this.closed) this.client.resume();
  }

  /** The proxy answered the writer's BEGIN: the writer is told it is in a block; the backend stays idle until its next message. */
  private answerBegin(reply: Buffer[]): void {
    this.status = 'T';
    this.toClient.push(...reply);
    this.flushClient();
  }

  private apply(frame: Frame, steps: Step[]): void {
    for (const step of steps) {
      switch (step.do) {
        case 'forward':
          this.toBackend.push(frame.bytes);
          for (const e of step.expect) this.expect(e);
          break;
        case 'send':
          this.toBackend.push(step.bytes);
          for (const e of step.expect) this.expect(e);
          break;
        case 'reply':
          this.toClient.push(...step.bytes);
          this.flushClient();
          break;
        case 'holdBegin':
          this.answerBegin(step.bytes);
          break;
        case 'terminate':
          this.flushBackend();
          this.close();
          break;
        case 'fail':
          this.fail(step.reason);
          break;
      }
    }
  }

  private expect(e: Pending): void {
    e.copyEndsAt = this.copyEnds;
    if (this.skipping) {
      if (e.kind !== 'sync' && e.kind !== 'query') {
        this.skipped(e); // no response comes
        return;
      }
      this.skipping = false;
    }
    this.queue.push(e);
    if (e.kind === 'sync' || e.kind === 'query') this.pendingReady++;
  }

  private flushBackend(): void {
    if (this.toBackend.length === 0 || this.closed) return;
    const out = this.toBackend.length === 1 ? this.toBackend[0]! : Buffer.concat(this.toBackend);
    this.toBackend = [];
    if (!this.backend.socket.write(out)) {
      this.backendBlocked = true;
      this.client.pause();
    }
  }

  // ---- backend → writer -------------------------------------------------------------------------

  private onBackendData(chunk: Buffer): void {
    if (this.closed) return;
    const reader = this.backend.reader;
    try {
      if (chunk.length > 0) reader.push(chunk);
      for (let f = reader.next(); f !== null && !this.closed; f = reader.next()) this.onBackendFrame(f);
    } catch (err) {
      this.fail('malformed message from the database', err);
      return;
    }
    this.flushClient();
    if (!this.losing && (this.pendingReady === 0 || this.copyStream !== null || this.owedSync) && this.clientFrames.length > 0)
      this.pumpClient();
  }

  private flushClient(): void {
    if (this.toClient.length === 0 || this.client.destroyed) return;
    const out = this.toClient.length === 1 ? this.toClient[0]! : Buffer.concat(this.toClient);
    this.toClient = [];
    if (!this.client.write(out)) this.backend.socket.pause();
  }

  private forward(f: Frame, e: Pending | undefined): void {
    if (e === undefined || !e.injected) this.toClient.push(f.bytes);
  }

  private pop(kinds: readonly Kind[], f: Frame): Pending {
    const e = this.queue.shift();
    if (e === undefined || !kinds.includes(e.kind))
      throw new Error(`message ${JSON.stringify(f.type)} from the database does not answer ${e?.kind ?? 'anything'}`);
    return e;
  }

  /** The writer's CopyDone or CopyFail went to the backend. */
  private endCopyStream(): void {
    this.copyEnds++;
    if (this.copyStream === null) return;
    if (this.copyStream.extended) this.owedSync = true;
    this.copyStream = null;
  }

  /** CopyInResponse to `head`, the writer's Query or Execute (see NOT_COPY_DATA). */
  private onCopyIn(head: Pending | undefined): void {
    if (head === undefined) throw new Error('CopyInResponse from the database answers nothing');
    this.copyActive = true;
    const extended = head.kind === 'execute';
    if (extended) {
      // What the writer sent after the Execute reached the backend in COPY IN, up to its copy end.
      const during = this.queue.slice(1).filter((e) => e.copyEndsAt === head.copyEndsAt);
      if (during.some((e) => e.kind !== 'sync')) {
        this.fail(NOT_COPY_DATA);
        return;
      }
      // Ignored Syncs: the first one's ReadyForQuery comes after the copy (owedSync); no other one's does.
      for (const e of during.slice(1)) {
        this.queue.splice(this.queue.indexOf(e), 1);
        this.pendingReady--;
      }
    }
    if (this.copyEnds === head.copyEndsAt) this.copyStream = { extended };
    else if (extended) this.owedSync = true; // the writer's copy end went with its pipeline
  }

  private onBackendFrame(f: Frame): void {
    const head = this.queue[0];
    if (f.type === 'G') {
      this.onCopyIn(head);
      if (this.closed) return;
    } else if (this.copyActive && (f.type === 'C' || f.type === 'E')) {
      // The copy is over on the backend's side (an error aborts it: the backend drops the rest of
      // the writer's copy data; after an Execute it waits for a Sync).
      this.copyActive = false;
      if (this.copyStream?.extended) this.owedSync = true;
      this.copyStream = null;
    }
    if (head?.kind === 'query' && f.type !== 'Z' && f.type !== 'E' && f.type !== 'S' && f.type !== 'A') {
      this.onQueryMessage(f, head);
      return;
    }
    switch (f.type) {
      case 'N': // notices of injected statements are ours
        this.forward(f, head);
        return;
      case 'S': {
        // Postgres reports a setting only when its value changes; the proxy's own statements (the
        // gate's read-write default) may set one to what the writer was told already: not again.
        const { name, value } = this.noteParameter(f.body);
        if (this.told.get(name) === value) return;
        this.told.set(name, value);
        this.toClient.push(f.bytes);
        return;
      }
      case 'A':
        this.toClient.push(f.bytes);
        return;
      case '1':
        this.forward(f, this.confirmed(this.pop(['parse'], f)));
        return;
      case '2':
        this.forward(f, this.confirmed(this.pop(['bind'], f)));
        return;
      case '3':
        this.forward(f, this.confirmed(this.pop(['close'], f)));
        return;
      case 't':
        this.forward(f, head);
        return;
      case 'T':
      case 'n':
        if (head?.kind === 'describe') this.forward(f, this.pop(['describe'], f));
        else this.forward(f, head);
        return;
      case 'C':
      case 'I':
      case 's': {
        if (head === undefined || !head.injected) this.noteCommand(f, head?.kind === 'execute');
        else if (head.fence && f.type === 'C') this.noteFence(f);
        if (head?.kind === 'execute') this.forward(f, this.pop(['execute'], f));
        else this.forward(f, head);
        return;
      }
      case 'E':
        this.onError(f, head);
        return;
      case 'Z':
        this.onReady(f);
        return;
      default: // DataRow, COPY, FunctionCallResponse, …: the writer's, unless an injected statement's
        this.forward(f, head);
    }
  }

  /** A response to a writer's Query, minus what answers the fence inside it (by statement). */
  private onQueryMessage(f: Frame, e: Pending): void {
    if (e.injected) {
      e.capture?.(f);
      return;
    }
    const ours = e.plan?.[e.at ?? 0] ?? false;
    if (f.type === 'C' || f.type === 'I') e.at = (e.at ?? 0) + 1;
    if (ours) {
      if (f.type === 'C') this.noteFence(f);
      return;
    }
    this.noteCommand(f, false);
    this.toClient.push(f.bytes);
  }

  /** An ErrorResponse to a writer's Query: the fence's own (stale), or the writer's with its position moved back. */
  private queryError(f: Frame, e: Pending): Buffer {
    const fields = parseErrorFields(f.body);
    if (e.plan?.[e.at ?? 0] ?? false) return this.onFenceError(fields, f.bytes);
    const position = Number(fields.get('P'));
    if (e.insertions === undefined || e.insertions.length === 0 || !Number.isInteger(position)) return f.bytes;
    // 1-based, in the text sent: back to the writer's text, minus the fence inserted before it.
    let moved = position;
    for (const ins of e.insertions) if (ins.start < position - 1) moved -= Math.min(ins.length, position - 1 - ins.start);
    fields.set('P', String(Math.max(1, moved)));
    const parts: Buffer[] = [];
    for (const [code, value] of fields) parts.push(Buffer.from(code, 'latin1'), Buffer.from(`${value}\u0000`, 'utf8'));
    parts.push(Buffer.from([0]));
    return message('E', ...parts);
  }

  /** The fence statement's CommandComplete ("SET" of its first statement is not it): a proof that passed counts the transaction. */
  private noteFence(f: Frame): void {
    const pair = this.planner.fence.pair;
    if (pair !== null && commandTag(f.body).startsWith('SELECT')) {
      this.fenced = true;
      this.fencedKey = pair.fenceKey;
      this.spoiled = null;
    }
  }

  /** The fenced transaction, if one is open, ended so. */
  private endFenced(end: TransactionEnd): void {
    if (!this.fenced) return;
    this.fenced = false;
    this.spoiled = null;
    this.opts.onTransactionEnd?.(end, this.fencedKey);
  }

  /** The writer's Parse, Bind or Close took effect: the planner records what it changes. */
  private confirmed(e: Pending): Pending {
    if (!e.injected && e.change !== undefined) this.planner.confirm(e.change);
    return e;
  }

  /**
   * DISCARD ALL / DEALLOCATE drop prepared statements, ours too: prepare again before the next
   * fence. The writer's kinds are forgotten too, unless the planner saw which (a Query's DEALLOCATE name).
   */
  private noteCommand(f: Frame, extended: boolean): void {
    if (f.type !== 'C') return;
    const tag = commandTag(f.body);
    if (tag === 'COMMIT') this.endFenced('accepted');
    else if (tag === 'ROLLBACK') this.spoiled ??= 'rolled_back';
    if (tag === 'DISCARD ALL' || tag.startsWith('DEALLOCATE')) this.planner.statementsDropped();
    // DISCARD SEQUENCES forgets the session's fence, DISCARD TEMP its setup (rule.ts), ALL both.
    if (tag === 'DISCARD ALL' || tag === 'DISCARD SEQUENCES' || tag === 'DISCARD TEMP')
      this.opts.gate?.invalidate(tag !== 'DISCARD SEQUENCES');
    if (tag === 'RESET') this.opts.gate?.noteReset();
    if (tag === 'DISCARD ALL' || tag === 'DEALLOCATE ALL' || (tag === 'DEALLOCATE' && extended)) this.planner.writerStatementsDropped();
  }

  /** A 25006 of a session without a fence gets the hint naming fencepost.token; a fenced session's is its own (BEGIN READ ONLY). */
  private hinted(bytes: Buffer): Buffer {
    return this.planner.fence.pair === null ? withReadOnlyHint(bytes) : bytes;
  }

  private onError(f: Frame, head: Pending | undefined): void {
    this.failed = true;
    if (this.fenced) this.spoiled = 'invalid';
    if (head?.kind === 'query') {
      if (head.injected) {
        head.capture?.(f);
        return;
      }
      if (head.undoBeginOnFenceError && (head.plan?.[head.at ?? 0] ?? false)) head.fenceFailed = true;
      if (isFatal(f.body)) this.writerHeardFatal = true;
      this.toClient.push(this.hinted(this.queryError(f, head)));
      return; // a simple Query ends with its ReadyForQuery
    }
    if (head === undefined) {
      // A FATAL outside any request (shutdown, or pg_terminate_backend by a raise): the backend
      // takes nothing more. Lost now, not at the socket's close: a message the writer sends
      // meanwhile (a paused writer's COMMIT) is never forwarded, so it is answered as one that
      // came after the loss, not as a commit in flight.
      this.backendFatal = f.bytes;
      this.onBackendLost();
      return;
    }
    if (head.injected) {
      const fields = parseErrorFields(f.body);
      if (head.kind === 'parse' || head.kind === 'close' || (head.fence && fields.get('C') === INVALID_SQL_STATEMENT_NAME))
        this.planner.statementsDropped();
      this.toClient.push(head.fence ? this.onFenceError(fields, f.bytes) : f.bytes);
    } else {
      if (isFatal(f.body)) this.writerHeardFatal = true;
      this.toClient.push(this.hinted(f.bytes));
    }
    // Extended protocol: the backend skips everything up to the next Sync (no Query is sent inside
    // a group: planner.ts). Without one sent yet, it skips what comes until the writer's.
    while (this.queue.length > 0 && this.queue[0]!.kind !== 'sync') this.skipped(this.queue.shift()!);
    if (this.queue.length === 0) this.skipping = true;
  }

  /**
   * The fence statement failed; what the writer hears (as Postgres said it). A stale token is a
   * rejection (onStale); some other errors are counted as the HTTP door counts them. A fenced
   * session whose proof failed (fencepost_api.prove_transaction: a raise above its token) is fenced again
   * by the gate before its next transaction.
   */
  private onFenceError(fields: Map<string, string>, bytes: Buffer): Buffer {
    const code = fields.get('C') ?? '';
    // The proof failed (a raise above the session's token, or its epoch gone in a way the proof did
    // not name: currval's own 55000 / XX000): fence the session again before its next transaction.
    const proofFailed =
      code === STALE_TOKEN || code === RAISE_FIRST || code === OBJECT_NOT_IN_PREREQUISITE_STATE || code === INTERNAL_ERROR;
    if (this.planner.fence.pair !== null && proofFailed) this.opts.gate?.invalidate(false);
    if (code === STALE_TOKEN) {
      const stale = staleDetail(fields.get('D'));
      if (stale) this.opts.onStale(stale);
      return bytes;
    }
    const outcome = FENCE_ERROR_OUTCOMES[code];
    if (outcome !== undefined) this.opts.onFenceError?.(outcome);
    return bytes;
  }

  /** A message the backend refused or skipped: what it would change, changes nothing; fence statements it would prepare are not. */
  private skipped(e: Pending): void {
    if (e.change !== undefined) this.planner.discard(e.change);
    if (e.injected && e.kind === 'parse') this.planner.statementsDropped();
  }

  private onReady(f: Frame): void {
    const e = this.pop(['sync', 'query'], f);
    this.pendingReady--;
    this.status = String.fromCharCode(f.body[0] ?? 73);
    // Counted as the backend reports it, before any check of the planner's prediction.
    if (this.status === 'T') this.spoiled = null;
    else if (this.status === 'E') this.spoiled ??= 'invalid';
    else this.endFenced(this.spoiled ?? 'accepted');
    const failed = this.failed;
    this.failed = false;
    if (e.fenceFailed && this.status === 'E') {
      // The fence after the writer's lone BEGIN failed: roll the block back, so the writer's error
      // reads as a failed BEGIN and the session is idle, as a client that keeps its own transaction
      // state (psycopg2) believes. The ROLLBACK's ReadyForQuery is the writer's.
      this.toBackend.push(ROLLBACK);
      this.expect({ kind: 'query', injected: true, forwardReady: true, predict: 'I' });
      this.flushBackend();
      return;
    }
    if (e.predict !== undefined && !predictionHolds(e.predict, this.status, failed)) {
      this.lostTrack(e.predict);
      return;
    }
    if (e.forwardReady) this.toClient.push(f.bytes);
    if (e.refusal) this.toClient.push(...e.refusal);
    e.onReady?.();
    this.armIdleInTransaction();
  }

  /** The writer now owes the next message of a transaction it holds open: bound how long. */
  private armIdleInTransaction(): void {
    const limit = this.opts.idleInTransactionMs ?? 0;
    clearTimeout(this.idleTimer);
    if (limit <= 0 || this.status === 'I' || this.queue.length > 0 || this.clientFrames.length > 0) return;
    this.idleTimer = setTimeout(() => this.endIdleTransaction(limit), limit);
    this.idleTimer.unref();
  }

  /**
   * The writer held its transaction open past the limit (a paused writer, say): the backend goes,
   * so the transaction rolls back and holds no fence; the writer hears it at its next message
   * (FP409 if a newer leader has raised the fence by then, else 25P03).
   */
  private endIdleTransaction(limit: number): void {
    if (this.closed || this.losing) return;
    this.losing = true;
    this.opts.logger.info({ limitMs: limit }, 'SQL session: a transaction idle past the limit was ended');
    const idle: ErrorFields = {
      severity: 'FATAL',
      code: IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
      message: `terminating the session: its transaction was idle longer than ${limit} ms (FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS)`,
      detail: 'the transaction rolled back: nothing of it was applied',
    };
    this.flushClient();
    this.answerNextWith(async () => {
      const stale = (await this.opts.lostReason?.(false).catch(() => null)) ?? null;
      // Stale: counted as rejected (onStale). Else ended for the writer's idleness: invalid.
      if (stale !== null) this.fenced = false;
      this.endFenced('invalid');
      return errorResponse(stale ?? idle);
    });
  }

  /** The backend's transaction state is not the planner's: end the session, never go on in a transaction the fence may not cover. */
  private lostTrack(predicted: 'I' | 'T'): void {
    this.opts.logger.error(
      { predicted, reported: this.status },
      "SQL session closed: the backend's transaction state is not what the proxy predicted",
    );
    this.flushClient();
    if (!this.client.destroyed) {
      this.client.end(
        errorResponse({
          severity: 'FATAL',
          code: INTERNAL_ERROR,
          message: "the fencepost SQL endpoint lost track of the session's transaction state; the session is closed",
          detail:
            this.status === 'T'
              ? 'the open transaction was rolled back'
              : 'statements after an unforeseen end of a transaction may have run and committed',
        }),
      );
    }
    this.close();
  }
}

/** An ErrorResponse whose severity ends the session (FATAL, PANIC). */
function isFatal(body: Buffer): boolean {
  const fields = parseErrorFields(body);
  const severity = fields.get('V') ?? fields.get('S');
  return severity === 'FATAL' || severity === 'PANIC';
}
