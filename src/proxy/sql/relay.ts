// The session's plumbing: reads the writer's messages, sends what the planner decides for each, and
// sorts the backend's responses into the writer's and the proxy's.
//
// Each message sent to the backend has a reply owed (replies.ts), the proxy's own or the writer's;
// the proxy's are swallowed (notices included), the writer's forwarded as they came. A new group is
// held until the previous one's ReadyForQuery says whether the session is idle; one that would start
// a transaction also waits for the fencer (the forgery guard and the raise, fencer.ts). COPY FROM STDIN
// is copy-in.ts, counting fenced transactions tally.ts, a session the writer did not end
// session-end.ts.
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
import { Outbox, bodyByte, type MessageReader, type Frame } from './wire/framing.ts';
import {
  frameTag,
  dataRowTexts,
  errorFromFields,
  errorResponse,
  isFatal,
  parameterOf,
  parseErrorFields,
  type ErrorFields,
} from './wire/backend.ts';
import { decodeClient, encode, type ClientMessage } from './wire/frontend.ts';
import { staleDetail } from './proof.ts';
import {
  DURABILITY_UNSAFE,
  STALE_TOKEN,
  GUARD_UNAVAILABLE,
  INVALID_FENCE_SETTING,
  RAISE_FIRST,
  FEATURE_NOT_SUPPORTED,
  INTERNAL_ERROR,
  INVALID_SQL_STATEMENT_NAME,
  LOCK_NOT_AVAILABLE,
  OBJECT_NOT_IN_PREREQUISITE_STATE,
  QUERY_CANCELED,
  READ_ONLY_SQL_TRANSACTION,
  PROTOCOL_VIOLATION,
} from '../../fence/index.ts';
import { EXPECT, type Expect, type Planner, type Step } from './planner.ts';
import type { Backend } from './backend.ts';
import { Replies, replyOf, type Reply } from './replies.ts';
import { CopyIn } from './copy-in.ts';
import { TransactionTally, type TransactionEnd } from './tally.ts';
import { SessionEnd } from './session-end.ts';

export type { TransactionEnd } from './tally.ts';

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

const ROLLBACK = encode({ type: 'query', text: 'ROLLBACK' });
const FLUSH = encode({ type: 'flush' });
/**
 * After a COPY that failed: a Sync (ends the skipping of an extended group) and an empty Query,
 * whose EmptyQueryResponse nothing else answers.
 */
const RECOUNT = Buffer.concat([encode({ type: 'sync' }), encode({ type: 'query', text: '' })]);
const TWO_PHASE_HINT =
  "a fenced session's transactions read a temporary object of its fence, so PREPARE TRANSACTION (two-phase commit) is refused on the fencepost SQL endpoint: end the transaction with COMMIT";
const READ_ONLY_HINT =
  "on the fencepost SQL endpoint a session writes only with a fencing token: SET fencepost.token = '<token>' and fencepost.fence_key = '<fence key>' (or -c fencepost.token=… -c fencepost.fence_key=… in the startup options); without one every transaction is read-only";

/**
 * A writer's error with the hint the endpoint owes it, unless it has a hint of its own: a
 * "read-only transaction" (25006) of a session without a fence names fencepost.token; PREPARE
 * TRANSACTION's "operated on temporary objects" (0A000) says why two-phase commit is refused.
 */
function withHint(bytes: Buffer, fenced: boolean): Buffer {
  const fields = parseErrorFields(bytes.subarray(5));
  if (fields.has('H')) return bytes;
  const code = fields.get('C');
  let hint: string;
  if (code === READ_ONLY_SQL_TRANSACTION && !fenced) hint = READ_ONLY_HINT;
  else if (code === FEATURE_NOT_SUPPORTED && fenced && /PREPARE a transaction .*temporary objects/.test(fields.get('M') ?? ''))
    hint = TWO_PHASE_HINT;
  else return bytes;
  fields.set('H', hint);
  return errorFromFields(fields);
}

/**
 * Does a ReadyForQuery's status agree with the planner's prediction? A block ('T') must have been
 * predicted; idle ('I') when a block was predicted only if something failed (the rest was skipped);
 * a failed block ('E') when a block was predicted, or idle only if something failed (a statement
 * ahead of the writer's COMMIT or ROLLBACK): a failed block where nothing failed and the writer's
 * statements end the block is not what they did, and the next message would be planned from it.
 */
function predictionHolds(predicted: 'I' | 'T', reported: string, failed: boolean): boolean {
  if (reported === 'T') return predicted === 'T';
  if (reported === 'I') return predicted === 'I' || failed;
  return predicted === 'T' || failed;
}

/** A ReadyForQuery's transaction status ('I' if it has none). */
function statusOf(f: Frame): string {
  return String.fromCharCode(bodyByte(f, 0) ?? 73);
}

export class Relay {
  /** The backend's transaction status at its last ReadyForQuery. */
  private status = 'I';
  private readonly replies: Replies;
  private readonly copy: CopyIn;
  private readonly tally: TransactionTally;
  private readonly end: SessionEnd;
  /** The writer's messages read and not yet sent on (held for a ReadyForQuery, the fencer or the startup fence). */
  private readonly clientFrames: Frame[] = [];
  /** The decoded message of each of clientFrames, at the same index. */
  private readonly clientMsgs: ClientMessage[] = [];
  /** The messages holdExtendedBegin looks at (one array, refilled each time). */
  private readonly lookahead: ClientMessage[] = [];
  private readonly toBackend = new Outbox();
  private readonly toClient = new Outbox();
  private holding = false;
  /** The session is being fenced for its startup settings (session.ts): the writer's messages wait. */
  private startupHold = false;
  /** An ErrorResponse came since the last ReadyForQuery. */
  private failed = false;
  /**
   * A writer's statement answered COMMIT or ROLLBACK since the last ReadyForQuery. If that one
   * reports a block, it may be a new one the planner did not see open (SQL EXECUTE of a COMMIT AND
   * CHAIN prepared with Parse: not a transaction statement to the planner, and Postgres chains
   * only at the end of the Query or at Sync, after any proof the group carried): it owes its fence.
   */
  private writerEnded = false;
  /** The backend's socket buffer is full: stop reading the writer until it drains. */
  private backendBlocked = false;
  private closed = false;
  /** A Flush of the proxy's went to the backend for a Query waiting inside an open group. */
  private flushAsked = false;
  /**
   * A COPY the backend ended with an error, up to `uncertain` Syncs of the writer's answered or
   * not (copy-in.ts): its ReadyForQuery messages are held until the answer to `marker`, the
   * proxy's empty Query, says how many came. `before`: how many of them answer replies queued
   * ahead of those Syncs (the COPY's own Query).
   */
  private recount: { uncertain: number; before: number; marker: Reply; held: Frame[] } | null = null;

  /** The value of each reported setting as the writer last heard it (ParameterStatus). */
  private readonly told = new Map<string, string>();

  constructor(
    private readonly client: Socket,
    private readonly clientReader: MessageReader,
    private readonly backend: Backend,
    private readonly planner: Planner,
    private readonly opts: RelayOptions,
  ) {
    this.replies = new Replies(planner);
    this.copy = new CopyIn(this.replies);
    this.tally = new TransactionTally((end, fenceKey) => opts.onTransactionEnd?.(end, fenceKey));
    this.end = new SessionEnd({
      client,
      backend: backend.socket,
      logger: opts.logger,
      replies: this.replies,
      tally: this.tally,
      status: () => this.status,
      failed: () => this.failed,
      held: (drop) => {
        const n = this.clientFrames.length;
        if (drop) {
          this.clientFrames.length = 0;
          this.clientMsgs.length = 0;
        }
        return n;
      },
      push: (bytes) => this.toClient.push(bytes),
      flushClient: () => this.flushClient(),
      close: () => this.close(),
      closed: () => this.closed,
      lostReason: opts.lostReason,
    });
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
    this.backend.socket.on('error', () => this.end.backendLost());
    this.backend.socket.on('close', () => this.end.backendLost());
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

  /** Goes on with the writer's messages held for the fencer. */
  resume(): void {
    if (this.closed || this.end.losing) return; // what the fencer held is answered by the session's end
    this.pumpClient();
    this.flushClient();
  }

  /** A Query of the proxy's ahead of the writer's next message: `onRow` sees its rows, `then` runs at its ReadyForQuery. */
  query(sql: string, onRow: (values: string[]) => void, then: () => void, onError?: (fields: Map<string, string>) => void): void {
    this.toBackend.push(encode({ type: 'query', text: sql }));
    this.expect({
      ...EXPECT,
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
    this.tally.end(this.end.losing ? 'error' : 'rolled_back');
    this.closed = true;
    this.end.disarmIdle();
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

  private noteParameter(body: Buffer): { name: string; value: string } {
    const p = parameterOf(body);
    this.planner.noteParameter(p.name, p.value);
    return p;
  }

  // ---- writer → backend -------------------------------------------------------------------------

  private onClientData(chunk: Buffer): void {
    if (this.closed) return;
    if (this.end.losing) {
      // The backend is gone and the writer's answer not known yet: it is owed one.
      if (chunk.length > 0) this.end.spoke();
      return;
    }
    this.end.disarmIdle();
    try {
      if (chunk.length > 0) this.clientReader.push(chunk);
      for (let f = this.clientReader.next(); f !== null; f = this.clientReader.next()) {
        this.clientFrames.push(f);
        this.clientMsgs.push(decodeClient(f));
      }
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
      const frame = this.clientFrames[i]!;
      const msg = this.clientMsgs[i]!;
      if (this.copy.open && msg.type !== 'copy') {
        const admitted = this.copy.admit(msg);
        if (admitted === 'pass' || typeof admitted === 'object') {
          // Ignored by the backend in COPY IN; after it, the Sync the copy's group still needs,
          // answering the reply kept from an ignored one.
          i++;
          this.toBackend.frame(frame);
          if (typeof admitted === 'object') this.replies.expect(admitted);
          continue;
        }
        this.flushBackend();
        if (admitted === 'leave') this.close();
        else this.fail(admitted);
        return;
      }
      if (this.replies.awaitingReady && this.planner.opensGroup(msg)) break;
      if (msg.type === 'query' && this.planner.inGroup()) {
        // A Query inside an open group (asyncpg: Parse/Describe/Flush, then a Query): planned once
        // the group's answers are in, as asyncpg waits for them too. After an error the backend
        // skips everything but Sync, a Query too, with no answer: so does the proxy.
        if (this.replies.waiting) {
          // The backend holds its answers until a Flush or Sync: ask for them (a Flush answers nothing).
          if (!this.flushAsked) this.toBackend.push(FLUSH);
          this.flushAsked = true;
          break;
        }
        this.flushAsked = false;
        if (this.replies.skipping) {
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
      if (msg.type === 'bind' && this.status === 'I' && !this.replies.awaitingReady) {
        // A lone BEGIN group: answered here, held for the next message (planner.ts holdExtendedBegin).
        const next = this.lookahead;
        next.length = 0;
        for (let k = i; k < i + 4 && k < this.clientMsgs.length; k++) next.push(this.clientMsgs[k]!);
        const held = this.planner.holdExtendedBegin(next, { status: this.status, awaiting: this.replies.waiting });
        next.length = 0;
        if (held !== null) {
          i += held.taken;
          this.answerBegin(held.reply);
          continue;
        }
      }
      i++;
      if (gate && (msg.type === 'query' || msg.type === 'parse')) gate.noteText(msg.text);
      this.apply(frame, this.planner.plan(msg, { status: this.status, awaiting: this.replies.waiting }));
      if (frame.type === 'c' || frame.type === 'f') this.copy.ended();
    }
    if (i === this.clientFrames.length) {
      this.clientFrames.length = 0;
      this.clientMsgs.length = 0;
    } else if (i > 0) {
      this.clientFrames.splice(0, i);
      this.clientMsgs.splice(0, i);
    }
    this.holding = this.clientFrames.length > 0;
    this.flushBackend();
    if (this.holding || this.backendBlocked) this.client.pause();
    else if (!this.closed) this.client.resume();
  }

  /** The proxy answered the writer's BEGIN: the writer is told it is in a block; the backend stays idle until its next message. */
  private answerBegin(reply: Buffer[]): void {
    this.status = 'T';
    this.toClient.pushAll(reply);
    this.flushClient();
  }

  private apply(frame: Frame, steps: Step[]): void {
    for (const step of steps) {
      switch (step.do) {
        case 'forward':
          this.toBackend.frame(frame);
          for (const e of step.expect) this.expect(e);
          break;
        case 'send':
          this.toBackend.push(step.bytes);
          for (const e of step.expect) this.expect(e);
          break;
        case 'reply':
          this.toClient.pushAll(step.bytes);
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

  private expect(e: Expect & Pick<Reply, 'capture' | 'onReady'>): void {
    this.replies.expect(replyOf(e, this.copy.endsSent));
  }

  private flushBackend(): void {
    if (this.toBackend.empty || this.closed) return;
    const out = this.toBackend.take()!;
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
    if (!this.end.losing && (!this.replies.awaitingReady || this.copy.open) && this.clientFrames.length > 0) this.pumpClient();
  }

  private flushClient(): void {
    if (this.toClient.empty || this.client.destroyed) return;
    const out = this.toClient.take()!;
    if (!this.client.write(out)) this.backend.socket.pause();
  }

  private forward(f: Frame, e: Reply | undefined): void {
    if (e === undefined || !e.injected) this.toClient.frame(f);
  }

  private onBackendFrame(f: Frame): void {
    if (this.recount !== null) {
      // Until the proxy's empty Query is answered (or refused: a cancel), no ReadyForQuery is taken
      // for the answer to anything. (Nothing else in flight answers with either: only the writer's
      // Syncs, Flushes and copy data went since the copy failed.)
      if (f.type === 'Z') {
        this.recount.held.push(f);
        return;
      }
      if (f.type === 'I' || (f.type === 'E' && !isFatal(f.body))) {
        this.settleRecount();
        if (this.closed) return;
      }
    }
    const head = this.replies.head;
    let uncertain = 0;
    if (f.type === 'G') {
      const failure = this.copy.onCopyInResponse(head);
      if (failure !== null) this.fail(failure);
      if (this.closed) return;
    } else if (f.type === 'C' || f.type === 'E') {
      uncertain = this.copy.onEnd(f.type === 'E');
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
        this.toClient.frame(f);
        return;
      }
      case 'A':
        this.toClient.frame(f);
        return;
      case '1':
        this.forward(f, this.confirmed(this.replies.pop(f, 'parse')));
        return;
      case '2':
        this.forward(f, this.confirmed(this.replies.pop(f, 'bind')));
        return;
      case '3':
        this.forward(f, this.confirmed(this.replies.pop(f, 'close')));
        return;
      case 't':
        this.forward(f, head);
        return;
      case 'T':
      case 'n':
        if (head?.kind === 'describe') this.forward(f, this.replies.pop(f, 'describe'));
        else this.forward(f, head);
        return;
      case 'C':
      case 'I':
      case 's': {
        if (head === undefined || !head.injected) this.noteCommand(f, head?.kind === 'execute');
        else if (head.fence && f.type === 'C') this.noteFence(f);
        if (head?.kind === 'execute') this.forward(f, this.replies.pop(f, 'execute'));
        else this.forward(f, head);
        return;
      }
      case 'E':
        this.onError(f, head);
        if (uncertain > 0 && !this.closed) this.startRecount(uncertain, head?.kind === 'query' ? 1 : 0);
        return;
      case 'Z':
        this.onReady(f);
        return;
      default: // DataRow, COPY, FunctionCallResponse, …: the writer's, unless an injected statement's
        this.forward(f, head);
    }
  }

  /** A response to a writer's Query, minus what answers the fence inside it (by statement). */
  private onQueryMessage(f: Frame, e: Reply): void {
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
    this.toClient.frame(f);
  }

  /** An ErrorResponse to a writer's Query: the fence's own (stale), or the writer's with its position moved back. */
  private queryError(f: Frame, e: Reply): Buffer {
    const fields = parseErrorFields(f.body);
    if (e.plan?.[e.at ?? 0] ?? false) return this.onFenceError(fields, f.bytes);
    const position = Number(fields.get('P'));
    if (e.insertions === undefined || e.insertions.length === 0 || !Number.isInteger(position)) return f.bytes;
    // 1-based, in the text sent: back to the writer's text, minus the fence inserted before it.
    let moved = position;
    for (const ins of e.insertions) if (ins.start < position - 1) moved -= Math.min(ins.length, position - 1 - ins.start);
    fields.set('P', String(Math.max(1, moved)));
    return errorFromFields(fields);
  }

  /** The fence statement's CommandComplete ("SET" of its first statement is not it): a proof that passed counts the transaction. */
  private noteFence(f: Frame): void {
    this.tally.fenceTag(frameTag(f), this.planner.fence.pair?.fenceKey ?? null);
  }

  /** The writer's Parse, Bind or Close took effect: the planner records what it changes. */
  private confirmed(e: Reply): Reply {
    if (!e.injected && e.change !== undefined) this.planner.confirm(e.change);
    return e;
  }

  /**
   * DISCARD ALL / DEALLOCATE drop prepared statements, ours too: prepare again before the next
   * fence. The writer's kinds are forgotten too, unless the planner saw which (a Query's DEALLOCATE name).
   */
  private noteCommand(f: Frame, extended: boolean): void {
    if (f.type !== 'C') return;
    // Only COMMIT, ROLLBACK, RESET, DISCARD and DEALLOCATE matter here (and to the tally): no other tag is decoded.
    const first = bodyByte(f, 0);
    if (first !== 0x43 /* C */ && first !== 0x44 /* D */ && first !== 0x52 /* R */) return;
    const tag = frameTag(f);
    this.tally.commandTag(tag);
    if (tag === 'COMMIT' || tag === 'ROLLBACK') this.writerEnded = true;
    if (tag === 'DISCARD ALL' || tag.startsWith('DEALLOCATE')) this.planner.statementsDropped();
    // DISCARD SEQUENCES forgets the session's fence, DISCARD TEMP its setup (rule.ts), ALL both.
    if (tag === 'DISCARD ALL' || tag === 'DISCARD SEQUENCES' || tag === 'DISCARD TEMP')
      this.opts.gate?.invalidate(tag !== 'DISCARD SEQUENCES');
    if (tag === 'RESET') this.opts.gate?.noteReset();
    if (tag === 'DISCARD ALL' || tag === 'DEALLOCATE ALL' || (tag === 'DEALLOCATE' && extended)) this.planner.writerStatementsDropped();
  }

  /** A writer's error, with the hint the endpoint owes it (withHint). */
  private hinted(bytes: Buffer): Buffer {
    return withHint(bytes, this.planner.fence.pair !== null);
  }

  private onError(f: Frame, head: Reply | undefined): void {
    this.failed = true;
    this.tally.error();
    if (head?.kind === 'query') {
      if (head.injected) {
        head.capture?.(f);
        return;
      }
      const ours = head.plan?.[head.at ?? 0] ?? false;
      if (head.undoBeginOnFenceError && ours) head.fenceFailed = true;
      if (isFatal(f.body)) this.end.writerHeardFatal = true;
      if (head.proofOutcome && ours) head.proofOutcome.failed = true;
      // Behind a proof that failed, the writer's Query fails as the block it ran in (25P02): the
      // proof's error was its answer.
      else if (head.afterProof?.failed && !isFatal(f.body)) return;
      this.toClient.push(this.hinted(this.queryError(f, head)));
      return; // a simple Query ends with its ReadyForQuery
    }
    if (head === undefined) {
      // A FATAL outside any request (shutdown, or pg_terminate_backend by a raise): the backend
      // takes nothing more. Lost now, not at the socket's close: a message the writer sends
      // meanwhile (a paused writer's COMMIT) is never forwarded, so it is answered as one that
      // came after the loss, not as a commit in flight.
      this.end.backendSaidFatal(f.bytes);
      return;
    }
    if (head.injected) {
      const fields = parseErrorFields(f.body);
      if (head.kind === 'parse' || head.kind === 'close' || (head.fence && fields.get('C') === INVALID_SQL_STATEMENT_NAME))
        this.planner.statementsDropped();
      this.toClient.push(head.fence ? this.onFenceError(fields, f.bytes) : f.bytes);
    } else {
      if (isFatal(f.body)) this.end.writerHeardFatal = true;
      this.toClient.push(this.hinted(f.bytes));
    }
    // Extended protocol: the backend skips everything up to the next Sync (no Query is sent inside
    // a group: planner.ts). Without one sent yet, it skips what comes until the writer's.
    this.replies.skipToSync();
  }

  /**
   * The fence statement failed; what the writer hears (as Postgres said it). A stale token is a
   * rejection (onStale); some other errors are counted as the HTTP door counts them. A fenced
   * session whose proof failed (fencepost_api.prove_transaction: a raise above its token) is fenced again
   * by the fencer before its next transaction.
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

  /**
   * A COPY the backend ended with an error may answer up to `uncertain` Syncs of the writer's it
   * ignored or not (copy-in.ts): a Sync and an empty Query of the proxy's behind them, and every
   * ReadyForQuery held until the empty Query's answer.
   */
  private startRecount(uncertain: number, before: number): void {
    this.toBackend.push(RECOUNT);
    this.expect({ ...EXPECT, kind: 'sync', injected: true, forwardReady: false });
    const marker = replyOf({ ...EXPECT, kind: 'query', injected: true, forwardReady: false }, this.copy.endsSent);
    this.replies.expect(marker);
    this.recount = { uncertain, before, marker, held: [] };
    this.flushBackend();
  }

  /**
   * The proxy's empty Query is answered: every ReadyForQuery before it is in. Those beyond the
   * replies queued ahead of it answer the writer's Syncs the backend read after the copy failed:
   * forwarded (Postgres answers them), none taken for the answer to anything queued.
   */
  private settleRecount(): void {
    const { uncertain, before, marker, held } = this.recount!;
    this.recount = null;
    const queued = this.replies.before(marker);
    const answered = held.length - queued;
    if (queued < before || answered < 0 || answered > uncertain) {
      this.fail(`${held.length} ReadyForQuery messages from the database after a failed COPY, ${queued} expected`);
      return;
    }
    for (const [i, f] of held.entries()) {
      if (this.closed) return;
      if (i >= before && i < before + answered) {
        this.status = statusOf(f);
        this.planner.noteReady(this.status, false);
        this.tally.ready(this.status);
        this.toClient.frame(f);
      } else {
        this.onReady(f);
      }
    }
  }

  private onReady(f: Frame): void {
    const e = this.replies.pop(f, 'sync', 'query');
    this.status = statusOf(f);
    this.planner.noteReady(this.status, this.writerEnded);
    this.writerEnded = false;
    // Counted as the backend reports it, before any check of the planner's prediction.
    this.tally.ready(this.status);
    const failed = this.failed;
    this.failed = false;
    if (e.fenceFailed && this.status === 'E') {
      // The fence after the writer's lone BEGIN failed: roll the block back, so the writer's error
      // reads as a failed BEGIN and the session is idle, as a client that keeps its own transaction
      // state (psycopg2) believes. The ROLLBACK's ReadyForQuery is the writer's.
      this.toBackend.push(ROLLBACK);
      this.expect({ ...EXPECT, kind: 'query', injected: true, forwardReady: true, predict: 'I' });
      this.flushBackend();
      return;
    }
    if (e.predict !== undefined && !predictionHolds(e.predict, this.status, failed)) {
      this.end.lostTrack(e.predict);
      return;
    }
    if (e.forwardReady) this.toClient.frame(f);
    if (e.refusal) this.toClient.pushAll(e.refusal);
    e.onReady?.();
    this.end.armIdle(this.opts.idleInTransactionMs ?? 0);
  }
}
