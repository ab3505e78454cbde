// One writer's session after startup: relays messages between the writer and its backend
// connection, and fences every transaction the session starts.
//
// Whenever the last ReadyForQuery said idle ('I') and the writer starts something (a Query, a
// FunctionCall, or the first message of an extended-protocol group up to Sync), the proxy sends the
// fence first (src/proxy/sql/fence.ts: Bind/Execute of two prepared statements, no Sync), so
// the fence and the writer's statements are one backend transaction. A lone `BEGIN …` goes first
// and the fence right after it (in the same round trip), so an isolation level still applies.
// Inside a transaction ('T') nothing is injected: it was fenced when it began. In a failed one
// ('E') neither: the writer's ROLLBACK must go through.
//
// Each message sent to the backend has an expected response, tagged injected or the writer's; the
// responses of injected messages are swallowed (notices included), the writer's are forwarded as
// they came. An ErrorResponse outside a simple Query makes the backend skip to the next Sync: the
// expectations up to it are dropped (and a writer's Query skipped behind a failed fence gets a
// Sync of the proxy's, whose ReadyForQuery becomes the Query's). A new group is held until the
// previous one's ReadyForQuery says whether the session is idle.
//
// Transactions that start in the middle of what the writer sent (libpg-query classifies the
// statements, see statements.ts; the read-only session default stays as a backstop):
// - Simple protocol: a Query with a `;` before its end and a transaction word in it is split by
//   the parser; the fence goes in front of the first statement of every transaction in it (after
//   each COMMIT / END / ROLLBACK / ABORT / PREPARE TRANSACTION, with or without AND CHAIN, that
//   is not the last statement; after a BEGIN that opens one), in the same Query string, so each
//   implicit transaction is fenced inside itself. The fence's own responses are swallowed by
//   position (one CommandComplete per statement). Text the parser refuses, or a session whose
//   lexing could differ from the parser's (standard_conforming_strings off, SJIS-like client
//   encodings) gets its multi-statement Query refused (42601 / 0A000), nothing run. A CALL or DO
//   in a Query always runs in a transaction block (the fence makes even a lone one a
//   multi-statement Query, an implicit block): Postgres itself refuses their COMMIT there.
// - COMMIT / ROLLBACK AND CHAIN open the next transaction themselves: the fence goes right after
//   them, in either protocol, even as the last statement.
// - Extended protocol: each Parse's statement kind is kept (per statement name, then per portal at
//   Bind). After an Execute of a statement that ends the transaction, the fence is injected before
//   the next Execute of the pipeline (after it, when that one is a BEGIN). A CALL or DO executed
//   outside a transaction block (where it could COMMIT itself) is refused: an injected statement
//   fails first (0A000), so the backend skips the rest of the pipeline up to Sync.
// - Forgery guard (when configured): before a transaction starts at idle, the session's token and
//   fence key (startup options; read back with a SELECT after text that mentions `fencepost`) are
//   put to the guard; its verdict goes to the fence as a parameter, and the fence refuses a raise
//   of a guarded fence by any pair the guard did not admit (migration 0010).
// - A lone DISCARD or CHECKPOINT goes unfenced (DISCARD ALL cannot run in a block); a Query of the
//   proxy's resets default_transaction_read_only first. Everything else is fenced, so Postgres
//   refuses a statement that cannot run in a transaction block (25001): VACUUM, CLUSTER, … .
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { MessageReader, errorResponse, message, parseErrorFields, type Frame } from './framing.ts';
import { fencePrefix, guardState, isEmptyQuery, prepareAndRunFence, prepareFence, runFence, runRoutineRefusal, sessionCapability, startsTransactionBlock, staleDetail, textArrayLiteral, PREPARED_STATEMENTS, RESET_READ_ONLY_SQL, STALE_TOKEN } from './fence.ts';
import { hasSeveralStatements, lexingIsSafe, needsSplitting, runsUnfenced, splitStatements, statementKind, type StatementKind } from './statements.ts';
import type { Backend } from './backend.ts';

type Kind = 'parse' | 'bind' | 'close' | 'describe' | 'execute' | 'sync' | 'query';

interface Expect {
  kind: Kind;
  injected: boolean;
  /** The fence statement's Execute. */
  fence?: boolean;
  /** sync/query: forward the ReadyForQuery to the writer. */
  forwardReady?: boolean;
  /** query: per statement of the text sent, true for the fence's (their responses are swallowed); later statements are the writer's. */
  plan?: boolean[];
  /** query: the statement of `plan` whose responses come now (one CommandComplete each). */
  at?: number;
  /** query: where the fence was inserted, in characters of the text sent (error positions move back). */
  insertions?: { start: number; length: number }[];
  /** An injected empty Query standing in for a refused one: the refusal to send at its ReadyForQuery. */
  refusal?: Buffer[];
  /** query (injected): sees its DataRows. */
  capture?: (f: Frame) => void;
  /** Called at its ReadyForQuery. */
  onReady?: () => void;
}

/** The forgery guard, as the session uses it (src/proxy/forgery-guard.ts). */
export interface SessionGuard {
  /** Every guarded fence-key prefix. */
  prefixes: readonly string[];
  /** Is this fence key guarded? */
  guards(fenceKey: string): boolean;
  /** Resolves when (fenceKey, token) may raise the fence; throws an ApiError (`unverified_token`, `unavailable`) when not. */
  admit(fenceKey: string, token: bigint): Promise<void>;
}

export interface StaleRefusal {
  fenceKey: string;
  token: bigint;
  highestToken: bigint | null;
}

export interface SessionOptions {
  logger: Logger;
  capability: string;
  /** The key's fence-key prefixes; null in open mode. */
  prefixes: readonly string[] | null;
  writerId: string;
  /** The forgery guard; null or absent: none. */
  guard?: SessionGuard | null;
  /** fencepost.token and fencepost.fence_key from the startup options. */
  startupSettings?: { token: string | null; fenceKey: string | null };
  onStale: (refusal: StaleRefusal) => void;
  onClose: () => void;
}

const SYNC = message('S');
const CLIENT_EXTENDED = new Set(['P', 'B', 'D', 'E', 'C', 'S', 'H']);
const COPY_FROM_CLIENT = new Set(['d', 'c', 'f']);

/** The text values of a DataRow (null as ''). */
function dataRowTexts(body: Buffer): string[] {
  const n = body.readInt16BE(0);
  const out: string[] = [];
  let at = 2;
  for (let i = 0; i < n; i++) {
    const len = body.readInt32BE(at);
    at += 4;
    if (len < 0) out.push('');
    else {
      out.push(body.toString('utf8', at, at + len));
      at += len;
    }
  }
  return out;
}

function cstringAt(body: Buffer, start: number): { value: string; end: number } {
  const end = body.indexOf(0, start);
  if (end < 0) return { value: '', end: body.length };
  return { value: body.toString('utf8', start, end), end: end + 1 };
}

export class PgwireSession {
  private status = 'I';
  private readonly queue: Expect[] = [];
  private pendingReady = 0;
  private groupOpen = false;
  private fenceAfterExecute = false;
  private prepared = false;
  private fenceRun: Buffer;
  private fenceText = '';
  private fenceChars = 0;
  /** Forgery guard: the session's settings as last known (null: read them back before the next transaction). */
  private guardSettings: { token: string | null; fenceKey: string | null } | null = null;
  /** Forgery guard: what it said about a (fence key, token) of this session. */
  private guardChecked: { fenceKey: string; token: bigint; verdict: 'verified' | 'unavailable' | 'refused' } | null = null;
  private guardBusy = false;
  /** The guard did not admit the session's token: let the next transaction through (the fence refuses it), ask again after. */
  private guardPass = false;
  /** The kind of each prepared statement of the writer's (by name; '' is the unnamed one). */
  private readonly statementKinds = new Map<string, StatementKind>();
  /** The kind of each portal's statement (by portal name). */
  private readonly portalKinds = new Map<string, StatementKind>();
  /** Extended group: a statement ended the transaction; fence before the next Execute. */
  private fenceBeforeExecute = false;
  /** Extended group: the backend is (predicted to be) inside a transaction block. */
  private inBlock = false;
  /** ParameterStatus, for lexingIsSafe. */
  private standardConformingStrings = 'on';
  private clientEncoding = 'UTF8';
  private readonly clientFrames: Frame[] = [];
  private toBackend: Buffer[] = [];
  private toClient: Buffer[] = [];
  private holding = false;
  /** The backend's socket buffer is full: stop reading the writer until it drains. */
  private backendBlocked = false;
  private closed = false;

  constructor(
    private readonly client: Socket,
    private readonly clientReader: MessageReader,
    private readonly backend: Backend,
    private readonly opts: SessionOptions,
  ) {
    this.fenceRun = Buffer.alloc(0);
    this.buildFence();
    if (opts.guard) this.guardSettings = opts.startupSettings ?? { token: null, fenceKey: null };
    for (const b of backend.parameterStatus) this.noteParameter(b.subarray(5));
  }

  /** The guard state handed to the fence (null without a guard). */
  private guardParam(): string | null {
    const guard = this.opts.guard;
    if (!guard) return null;
    const c = this.guardChecked;
    return guardState(guard.prefixes, c === null || c.verdict === 'refused' ? null : { fenceKey: c.fenceKey, token: c.token, verdict: c.verdict });
  }

  /** The fence's Bind/Execute and SQL text for this session (again when the guard state changes). */
  private buildFence(): void {
    const opts = this.opts;
    const guard = this.guardParam();
    const prefixes = opts.prefixes === null ? null : textArrayLiteral(opts.prefixes);
    const sessionCap = sessionCapability(opts.capability, this.backend.pid, prefixes, opts.writerId, guard);
    this.fenceRun = runFence(sessionCap, prefixes, opts.writerId, guard);
    this.fenceText = fencePrefix(sessionCap, prefixes, opts.writerId, guard);
    this.fenceChars = [...this.fenceText].length;
  }

  /**
   * Forgery guard: may the transaction this frame starts go ahead now? It must wait while the
   * session's settings are read back or the guard asked about a token that could raise a guarded
   * fence. (The fence itself refuses whatever was not admitted: this only spares an admitted
   * leader's transaction that refusal.)
   */
  private guardReady(): boolean {
    const guard = this.opts.guard;
    if (!guard) return true;
    if (this.guardBusy) return false;
    if (this.guardPass) {
      this.guardPass = false;
      return true;
    }
    const s = this.guardSettings;
    if (s === null) return false;
    if (s.token === null || s.fenceKey === null || !/^[0-9]{1,19}$/.test(s.token) || !guard.guards(s.fenceKey)) return true;
    const token = BigInt(s.token);
    const c = this.guardChecked;
    return c !== null && c.fenceKey === s.fenceKey && c.token === token && c.verdict === 'verified';
  }

  /** Reads the settings back if needed, then asks the guard; resumes the writer's messages after. */
  private startGuardCheck(): void {
    if (this.guardBusy || !this.opts.guard) return;
    this.guardBusy = true;
    if (this.guardSettings === null) {
      const read: { token: string | null; fenceKey: string | null } = { token: null, fenceKey: null };
      this.toBackend.push(message('Q', "SELECT pg_catalog.current_setting('fencepost.token', true), pg_catalog.current_setting('fencepost.fence_key', true)"));
      this.expect({
        kind: 'query',
        injected: true,
        forwardReady: false,
        capture: (f) => {
          if (f.type !== 'D') return;
          const values = dataRowTexts(f.body);
          read.token = values[0] || null;
          read.fenceKey = values[1] || null;
        },
        onReady: () => {
          this.guardSettings = read;
          this.askGuard();
        },
      });
      this.flushBackend();
      return;
    }
    this.askGuard();
  }

  private askGuard(): void {
    const guard = this.opts.guard!;
    const s = this.guardSettings;
    if (s === null || s.token === null || s.fenceKey === null || !/^[0-9]{1,19}$/.test(s.token) || !guard.guards(s.fenceKey)) {
      queueMicrotask(() => this.guardDone());
      return;
    }
    const fenceKey = s.fenceKey;
    const token = BigInt(s.token);
    guard.admit(fenceKey, token).then(
      () => {
        this.guardChecked = { fenceKey, token, verdict: 'verified' };
      },
      (err: unknown) => {
        const unavailable = (err as { code?: string }).code === 'unavailable';
        this.opts.logger.info({ fenceKey, token: token.toString(), unavailable }, 'forgery guard did not admit the session\'s token');
        this.guardChecked = { fenceKey, token, verdict: unavailable ? 'unavailable' : 'refused' };
      },
    ).finally(() => this.guardDone());
  }

  private guardDone(): void {
    this.buildFence();
    this.guardBusy = false;
    this.guardPass = true; // whatever the verdict: the fence decides this transaction
    if (this.closed) return;
    this.pumpClient();
    this.flushClient();
  }

  /** The writer's text may change its fencepost settings: read them back before the next transaction. */
  private noteText(text: string): void {
    if (this.opts.guard && /fencepost/i.test(text)) this.guardSettings = null;
  }

  private noteParameter(body: Buffer): void {
    const name = cstringAt(body, 0);
    const value = cstringAt(body, name.end).value;
    if (name.value === 'standard_conforming_strings') this.standardConformingStrings = value;
    else if (name.value === 'client_encoding') this.clientEncoding = value;
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

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.backend.socket.destroy();
    this.client.destroy();
    this.opts.onClose();
  }

  /** The writer went away or broke the protocol; the backend rolls back what was open. */
  private fail(reason: string, err?: unknown): void {
    if (this.closed) return;
    this.opts.logger.warn({ err }, `SQL session closed: ${reason}`);
    if (!this.client.destroyed) this.client.end(errorResponse({ severity: 'FATAL', code: '08P01', message: reason }));
    this.close();
  }

  private onBackendLost(): void {
    if (this.closed) return;
    const inFlight = this.queue.length > 0 || this.status !== 'I';
    this.opts.logger.warn({ inFlight }, 'SQL session: the database connection was lost');
    this.flushClient();
    if (!this.client.destroyed) {
      this.client.end(
        errorResponse({
          severity: 'FATAL',
          code: '08006',
          message: 'the database connection was lost',
          detail: inFlight ? 'an open transaction did not commit; a COMMIT that was in flight may or may not have committed' : undefined,
        }),
      );
    }
    this.close();
  }

  // ---- writer → backend -------------------------------------------------------------------------

  private onClientData(chunk: Buffer): void {
    if (this.closed) return;
    try {
      if (chunk.length > 0) this.clientReader.push(chunk);
      for (let f = this.clientReader.next(); f !== null; f = this.clientReader.next()) this.clientFrames.push(f);
    } catch (err) {
      this.fail('malformed message from the client', err);
      return;
    }
    this.pumpClient();
  }

  private pumpClient(): void {
    let i = 0;
    while (i < this.clientFrames.length && !this.closed) {
      const f = this.clientFrames[i]!;
      if (this.pendingReady > 0 && (f.type === 'Q' || f.type === 'F' || (CLIENT_EXTENDED.has(f.type) && !this.groupOpen))) break;
      if (this.opts.guard && this.status === 'I' && (f.type === 'Q' || (CLIENT_EXTENDED.has(f.type) && !this.groupOpen && f.type !== 'S' && f.type !== 'H')) && !this.guardReady()) {
        // Before a transaction starts (only between ReadyForQuery and the next message: idle).
        this.startGuardCheck();
        break;
      }
      i++;
      this.onClientFrame(f);
    }
    this.clientFrames.splice(0, i);
    this.holding = this.clientFrames.length > 0;
    this.flushBackend();
    if (this.holding || this.backendBlocked) this.client.pause();
    else if (!this.closed) this.client.resume();
  }

  private expect(e: Expect): void {
    this.queue.push(e);
    if (e.kind === 'sync' || e.kind === 'query') this.pendingReady++;
  }

  /**
   * Prepares the fence statements (again, after DISCARD ALL or DEALLOCATE) in a transaction of
   * their own: parsing a SELECT takes a snapshot, after which no transaction can turn read-write.
   * Only when idle, before anything of the writer's.
   */
  private ensurePrepared(): void {
    if (this.prepared) return;
    this.toBackend.push(prepareFence(), SYNC);
    for (let i = 0; i < PREPARED_STATEMENTS; i++) this.expect({ kind: 'close', injected: true });
    for (let i = 0; i < PREPARED_STATEMENTS; i++) this.expect({ kind: 'parse', injected: true });
    this.expect({ kind: 'sync', injected: true, forwardReady: false });
    this.prepared = true;
  }

  private inject(): void {
    if (!this.prepared) {
      // Mid-pipeline, no Sync of our own possible: prepare each statement right before its run.
      this.toBackend.push(prepareAndRunFence(this.fenceRun));
      for (const kind of ['close', 'parse', 'bind', 'execute', 'close', 'parse', 'bind', 'execute', 'close', 'parse'] as const) this.expect({ kind, injected: true, fence: kind === 'execute' });
      this.prepared = true;
      return;
    }
    this.toBackend.push(this.fenceRun);
    this.expect({ kind: 'bind', injected: true });
    this.expect({ kind: 'execute', injected: true });
    this.expect({ kind: 'bind', injected: true });
    this.expect({ kind: 'execute', injected: true, fence: true });
  }

  private refuseRoutine(): void {
    this.toBackend.push(runRoutineRefusal());
    this.expect({ kind: 'bind', injected: true });
    this.expect({ kind: 'execute', injected: true });
  }

  /** An ErrorResponse and ReadyForQuery of the proxy's for a Query it does not send. */
  private refuseQuery(code: string, msg: string, detail: string): void {
    const reply = [errorResponse({ severity: 'ERROR', code, message: msg, detail }), message('Z', Buffer.from(this.status, 'latin1'))];
    if (this.queue.length === 0) {
      this.toClient.push(...reply);
      this.flushClient();
    } else {
      // Behind responses still to come: a Query of the proxy's that does nothing keeps the order.
      this.toBackend.push(message('Q', ''));
      this.expect({ kind: 'query', injected: true, forwardReady: false, refusal: reply });
    }
  }

  /**
   * A writer's Query: the text to send with the fence in front of every transaction that starts
   * in it, or a refusal. `idle`: the Query starts a transaction (else it continues one).
   */
  private planQuery(text: string, idle: boolean): { text: string; expect: Expect } | { refuse: [string, string, string] } {
    const base = { kind: 'query' as const, injected: false, forwardReady: true, at: 0 };
    if (!needsSplitting(text)) {
      // One statement, or several without a word that could start or end a transaction.
      if (!idle) return { text, expect: { ...base } };
      if (startsTransactionBlock(text) && !hasSeveralStatements(text)) {
        // A lone BEGIN …: first, so its isolation level applies; the fence right after it.
        return { text: `${text}\n;${this.fenceText}`, expect: { ...base, plan: [false, true, true] } };
      }
      return { text: `${this.fenceText}${text}`, expect: { ...base, plan: [true, true], insertions: [{ start: 0, length: this.fenceChars }] } };
    }
    if (!lexingIsSafe(this.standardConformingStrings, this.clientEncoding)) {
      return { refuse: ['0A000', 'the fencepost SQL endpoint runs one statement per Query in this session', `With standard_conforming_strings = ${this.standardConformingStrings} and client_encoding = ${this.clientEncoding} the proxy cannot tell where the statements of a Query end; send them one by one.`] };
    }
    const stmts = splitStatements(text);
    if (stmts === null) {
      return { refuse: ['42601', 'syntax error: the fencepost SQL endpoint could not split this Query into statements', 'PostgreSQL\'s parser refused the text; nothing of it was run.'] };
    }
    const bytes = Buffer.from(text, 'utf8');
    const parts: string[] = [];
    const plan: boolean[] = [];
    const insertions: { start: number; length: number }[] = [];
    let chars = 0; // characters sent so far
    let from = 0; // bytes of the writer's text copied so far
    const copyTo = (end: number) => {
      const piece = bytes.toString('utf8', from, end);
      parts.push(piece);
      chars += [...piece].length;
      from = end;
    };
    const fence = (piece: string) => {
      parts.push(piece);
      insertions.push({ start: chars, length: [...piece].length });
      chars += [...piece].length;
      plan.push(true, true);
    };
    let needFence = idle;
    stmts.forEach((st, i) => {
      const next = stmts[i + 1];
      if (needFence && st.kind !== 'begin') {
        copyTo(st.start);
        fence(this.fenceText);
        needFence = false;
      }
      plan.push(false);
      if (needFence) {
        // A BEGIN opens this transaction: the fence right after it, so its isolation level applies.
        copyTo(next !== undefined ? next.start : bytes.length);
        fence(next !== undefined ? this.fenceText : `\n;${this.fenceText}`);
        needFence = false;
      }
      if (st.kind === 'chain') {
        // The next transaction opens right away (in a block, already read-write): fence it now.
        copyTo(next !== undefined ? next.start : bytes.length);
        fence(next !== undefined ? this.fenceText : `\n;${this.fenceText}`);
      }
      // What follows a transaction's end runs in a new transaction: fence it too.
      if (st.kind === 'end' && next !== undefined) needFence = true;
    });
    copyTo(bytes.length);
    return { text: parts.join(''), expect: { ...base, plan, insertions } };
  }

  private onClientFrame(f: Frame): void {
    const t = f.type;
    if (t === 'F') {
      // FunctionCall runs a function by oid outside any statement the proxy could fence.
      if (this.queue.length === 0) {
        this.toClient.push(errorResponse({ severity: 'ERROR', code: '0A000', message: 'the fencepost SQL endpoint does not serve FunctionCall messages; call the function in a SELECT' }), message('Z', Buffer.from(this.status, 'latin1')));
        this.flushClient();
      }
      return;
    }
    if (t === 'Q') {
      const text = cstringAt(f.body, 0).value;
      this.noteText(text);
      // Inside an open extended group the last ReadyForQuery is old news: predict from the group.
      const idle = this.groupOpen ? this.fenceBeforeExecute : this.status === 'I';
      if (this.groupOpen) this.fenceBeforeExecute = false;
      if (isEmptyQuery(text)) {
        this.toBackend.push(f.bytes);
        this.expect({ kind: 'query', injected: false, forwardReady: true });
        return;
      }
      if (idle && runsUnfenced(text)) {
        // Unfenced, so read-only: undo a writer's `SET default_transaction_read_only = off` first.
        this.toBackend.push(message('Q', RESET_READ_ONLY_SQL), f.bytes);
        this.expect({ kind: 'query', injected: true, forwardReady: false });
        this.expect({ kind: 'query', injected: false, forwardReady: true });
        return;
      }
      const planned = this.planQuery(text, idle);
      if ('refuse' in planned) {
        this.refuseQuery(...planned.refuse);
        return;
      }
      this.toBackend.push(planned.text === text ? f.bytes : message('Q', planned.text));
      this.expect(planned.expect);
      return;
    }
    if (CLIENT_EXTENDED.has(t)) {
      if (!this.groupOpen && t !== 'S' && t !== 'H') {
        this.groupOpen = true;
        this.fenceBeforeExecute = false;
        this.inBlock = this.status !== 'I';
        // Prepared now (a Sync of its own) unless a failed transaction would refuse the Parse: a
        // fence the group may need after a COMMIT of its own cannot be prepared mid-group.
        if (this.status !== 'E') this.ensurePrepared();
        if (this.status === 'I') {
          if (this.opensWithBegin(f)) this.fenceAfterExecute = true;
          else this.inject();
        }
      }
      // After a COMMIT of the group, the fence must come before the next message that could take
      // a snapshot (Parse, Bind, Describe, Execute), unless that is a BEGIN: then right after it.
      if (t === 'P') {
        const name = cstringAt(f.body, 0);
        const sqlText = cstringAt(f.body, name.end).value;
        this.noteText(sqlText);
        const kind = statementKind(sqlText);
        this.statementKinds.set(name.value, kind);
        if (this.fenceBeforeExecute && kind !== 'begin') this.fencePending();
      } else if (t === 'B') {
        const portal = cstringAt(f.body, 0);
        const kind = this.statementKinds.get(cstringAt(f.body, portal.end).value) ?? 'unknown';
        this.portalKinds.set(portal.value, kind);
        if (this.fenceBeforeExecute && kind !== 'begin') this.fencePending();
      } else if (t === 'D') {
        if (this.fenceBeforeExecute) this.fencePending();
      } else if (t === 'E') {
        this.beforeExecute(this.portalKinds.get(cstringAt(f.body, 0).value) ?? 'unknown');
      }
      this.toBackend.push(f.bytes);
      switch (t) {
        case 'P':
          this.expect({ kind: 'parse', injected: false });
          return;
        case 'B':
          this.expect({ kind: 'bind', injected: false });
          return;
        case 'D':
          this.expect({ kind: 'describe', injected: false });
          return;
        case 'C':
          this.expect({ kind: 'close', injected: false });
          return;
        case 'E':
          this.expect({ kind: 'execute', injected: false });
          if (this.fenceAfterExecute) {
            this.fenceAfterExecute = false;
            this.inject();
          }
          return;
        case 'S':
          this.groupOpen = false;
          this.fenceAfterExecute = false;
          this.fenceBeforeExecute = false;
          this.expect({ kind: 'sync', injected: false, forwardReady: true });
          return;
        default: // 'H' Flush: no response of its own
          return;
      }
    }
    if (COPY_FROM_CLIENT.has(t)) {
      this.toBackend.push(f.bytes);
      return;
    }
    if (t === 'X') {
      this.flushBackend();
      this.close();
      return;
    }
    this.fail(`unexpected message type ${JSON.stringify(t)} from the client`);
  }

  /** Does this extended group start with a statement that begins a transaction block? */
  private opensWithBegin(f: Frame): boolean {
    if (f.type === 'P') return statementKind(cstringAt(f.body, cstringAt(f.body, 0).end).value) === 'begin';
    if (f.type === 'B') return this.statementKinds.get(cstringAt(f.body, cstringAt(f.body, 0).end).value) === 'begin';
    return false;
  }

  /**
   * Before a writer's Execute in an extended group: fence the transaction a COMMIT earlier in the
   * group left behind, refuse a CALL or DO outside a block, and predict the block state after it.
   * A prediction that an error makes wrong does not matter: the backend skips the rest to Sync.
   */
  private fencePending(): void {
    this.fenceBeforeExecute = false;
    this.inject();
  }

  private beforeExecute(kind: StatementKind): void {
    if (this.fenceBeforeExecute) {
      this.fenceBeforeExecute = false;
      if (kind === 'begin') this.fenceAfterExecute = true;
      else this.inject();
    }
    if ((kind === 'routine' || kind === 'unknown') && !this.inBlock) this.refuseRoutine();
    if (kind === 'begin') this.inBlock = true;
    // The next transaction opens right away, in a block: fence it right after this Execute.
    if (kind === 'chain') this.fenceAfterExecute = true;
    if (kind === 'end') {
      this.inBlock = false;
      this.fenceBeforeExecute = true;
    }
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
    if (this.pendingReady === 0 && this.clientFrames.length > 0) this.pumpClient();
  }

  private flushClient(): void {
    if (this.toClient.length === 0 || this.client.destroyed) return;
    const out = this.toClient.length === 1 ? this.toClient[0]! : Buffer.concat(this.toClient);
    this.toClient = [];
    if (!this.client.write(out)) this.backend.socket.pause();
  }

  private forward(f: Frame, e: Expect | undefined): void {
    if (e === undefined || !e.injected) this.toClient.push(f.bytes);
  }

  private pop(kinds: readonly Kind[], f: Frame): Expect {
    const e = this.queue.shift();
    if (e === undefined || !kinds.includes(e.kind)) throw new Error(`message ${JSON.stringify(f.type)} from the database does not answer ${e?.kind ?? 'anything'}`);
    return e;
  }

  private onBackendFrame(f: Frame): void {
    const head = this.queue[0];
    if (head?.kind === 'query' && f.type !== 'Z' && f.type !== 'E' && f.type !== 'S' && f.type !== 'A') {
      this.onQueryMessage(f, head);
      return;
    }
    switch (f.type) {
      case 'N': // notices of injected statements (SET LOCAL outside a block warns) are ours
        this.forward(f, head);
        return;
      case 'S':
        this.noteParameter(f.body);
        this.toClient.push(f.bytes);
        return;
      case 'A':
        this.toClient.push(f.bytes);
        return;
      case '1':
        this.forward(f, this.pop(['parse'], f));
        return;
      case '2':
        this.forward(f, this.pop(['bind'], f));
        return;
      case '3':
        this.forward(f, this.pop(['close'], f));
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
        if (head === undefined || !head.injected) this.noteCommand(f);
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
  private onQueryMessage(f: Frame, e: Expect): void {
    if (e.injected) {
      e.capture?.(f);
      return;
    }
    const ours = e.plan?.[e.at ?? 0] ?? false;
    if (f.type === 'C' || f.type === 'I') e.at = (e.at ?? 0) + 1;
    if (ours) return;
    this.noteCommand(f);
    this.toClient.push(f.bytes);
  }

  /** An ErrorResponse to a writer's Query: the fence's own (stale), or the writer's with its position moved back. */
  private queryError(f: Frame, e: Expect): Buffer {
    const fields = parseErrorFields(f.body);
    if (fields.get('C') === STALE_TOKEN && (e.plan?.[e.at ?? 0] ?? false)) {
      const stale = staleDetail(fields.get('D'));
      if (stale) this.opts.onStale(stale);
    }
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

  /** DISCARD ALL / DEALLOCATE drop prepared statements, ours too: prepare again before the next fence. */
  private noteCommand(f: Frame): void {
    if (f.type !== 'C') return;
    const tag = cstringAt(f.body, 0).value;
    if (tag === 'DISCARD ALL' || tag.startsWith('DEALLOCATE')) this.prepared = false;
  }

  private onError(f: Frame, head: Expect | undefined): void {
    if (head?.kind === 'query') {
      if (head.injected) return;
      this.toClient.push(this.queryError(f, head));
      return; // a simple Query ends with its ReadyForQuery
    }
    this.toClient.push(f.bytes);
    if (head === undefined) return; // e.g. FATAL at shutdown: the socket closes next
    if (head.injected) {
      const fields = parseErrorFields(f.body);
      if (head.kind === 'parse' || head.kind === 'close' || (head.fence && fields.get('C') === '26000')) this.prepared = false;
      if (head.fence && fields.get('C') === STALE_TOKEN) {
        const stale = staleDetail(fields.get('D'));
        if (stale) this.opts.onStale(stale);
      }
    }
    // Extended protocol: the backend skips everything up to the next Sync.
    let skippedQuery = false;
    while (this.queue.length > 0 && this.queue[0]!.kind !== 'sync') {
      const e = this.queue.shift()!;
      if (e.kind === 'query') {
        skippedQuery = true;
        this.pendingReady--;
      }
    }
    if (skippedQuery && this.queue.length === 0) {
      this.toBackend.push(SYNC);
      this.expect({ kind: 'sync', injected: true, forwardReady: true });
      this.flushBackend();
    }
  }

  private onReady(f: Frame): void {
    const e = this.pop(['sync', 'query'], f);
    this.pendingReady--;
    this.status = String.fromCharCode(f.body[0] ?? 73);
    if (e.forwardReady) this.toClient.push(f.bytes);
    if (e.refusal) this.toClient.push(...e.refusal);
    e.onReady?.();
  }
}
