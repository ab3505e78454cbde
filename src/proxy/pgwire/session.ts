// One writer's session after startup: relays messages between the writer and its backend
// connection, and fences every transaction the session starts.
//
// Whenever the last ReadyForQuery said idle ('I') and the writer starts something (a Query, a
// FunctionCall, or the first message of an extended-protocol group up to Sync), the proxy sends the
// fence first (src/proxy/pgwire/fence.ts: Bind/Execute of two prepared statements, no Sync), so
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
// Escapes: a transaction that starts without the proxy seeing it (COMMIT in the middle of a
// multi-statement Query, COMMIT AND CHAIN, a procedure or DO block that commits) is unfenced and
// read-only (the session default), so its writes fail with 25006. See docs/sql-endpoint.md for
// what a writer that lifts that default itself can still do.
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { MessageReader, errorResponse, message, parseErrorFields, type Frame } from './framing.ts';
import { fencePrefix, isEmptyQuery, runsOutsideTransactionBlock, prepareFence, runFence, sessionCapability, startsTransactionBlock, staleDetail, textArrayLiteral, STALE_TOKEN } from './fence.ts';
import type { Backend } from './backend.ts';

type Kind = 'parse' | 'bind' | 'close' | 'describe' | 'execute' | 'sync' | 'query';

interface Expect {
  kind: Kind;
  injected: boolean;
  /** The fence statement's Execute. */
  fence?: boolean;
  /** sync/query: forward the ReadyForQuery to the writer. */
  forwardReady?: boolean;
  /** query with the fence prepended: CommandCompletes of the prefix still to swallow. */
  swallowLeading?: number;
  /** query with the fence prepended: its length in characters (error positions move back by it). */
  shift?: number;
  /** query with the fence appended (after a lone BEGIN): the writer's completions still to forward; the rest is swallowed. */
  passCompletes?: number;
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
  onStale: (refusal: StaleRefusal) => void;
  onClose: () => void;
}

const SYNC = message('S');
const CLIENT_EXTENDED = new Set(['P', 'B', 'D', 'E', 'C', 'S', 'H']);
const COPY_FROM_CLIENT = new Set(['d', 'c', 'f']);

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
  private readonly fenceRun: Buffer;
  private readonly fenceText: string;
  private readonly fenceChars: number;
  /** Named statements whose text starts a transaction block (and the unnamed one). */
  private readonly beginStatements = new Set<string>();
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
    this.fenceRun = runFence(opts.capability, opts.prefixes, opts.writerId);
    const prefixes = opts.prefixes === null ? null : textArrayLiteral(opts.prefixes);
    this.fenceText = fencePrefix(sessionCapability(opts.capability, backend.pid, prefixes, opts.writerId), prefixes, opts.writerId);
    this.fenceChars = [...this.fenceText].length;
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
    for (const kind of ['close', 'close', 'parse', 'parse'] as const) this.expect({ kind, injected: true });
    this.expect({ kind: 'sync', injected: true, forwardReady: false });
    this.prepared = true;
  }

  private inject(): void {
    this.toBackend.push(this.fenceRun);
    this.expect({ kind: 'bind', injected: true });
    this.expect({ kind: 'execute', injected: true });
    this.expect({ kind: 'bind', injected: true });
    this.expect({ kind: 'execute', injected: true, fence: true });
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
      if (this.status !== 'I' || isEmptyQuery(text) || runsOutsideTransactionBlock(text)) {
        this.toBackend.push(f.bytes);
        this.expect({ kind: 'query', injected: false, forwardReady: true });
        return;
      }
      if (startsTransactionBlock(text) && !/;\s*\S/.test(text)) {
        // A lone BEGIN …: first, so its isolation level applies; the fence right after it.
        this.toBackend.push(message('Q', `${text}\n;${this.fenceText}`));
        this.expect({ kind: 'query', injected: false, forwardReady: true, passCompletes: 1 });
      } else {
        this.toBackend.push(message('Q', `${this.fenceText}${text}`));
        this.expect({ kind: 'query', injected: false, forwardReady: true, swallowLeading: 2, shift: this.fenceChars });
      }
      return;
    }
    if (CLIENT_EXTENDED.has(t)) {
      if (!this.groupOpen && t !== 'S' && t !== 'H') {
        this.groupOpen = true;
        if (this.status === 'I') {
          this.ensurePrepared();
          if (this.opensWithBegin(f)) this.fenceAfterExecute = true;
          else this.inject();
        }
      }
      if (t === 'P') {
        const name = cstringAt(f.body, 0);
        const text = cstringAt(f.body, name.end).value;
        if (startsTransactionBlock(text)) this.beginStatements.add(name.value);
        else this.beginStatements.delete(name.value);
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
    if (f.type === 'P') return startsTransactionBlock(cstringAt(f.body, cstringAt(f.body, 0).end).value);
    if (f.type === 'B') return this.beginStatements.has(cstringAt(f.body, cstringAt(f.body, 0).end).value);
    return false;
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

  /** A response to a writer's Query, minus what answers the fence around it. */
  private onQueryMessage(f: Frame, e: Expect): void {
    if (e.swallowLeading !== undefined && e.swallowLeading > 0) {
      if (f.type === 'C') e.swallowLeading--;
      return;
    }
    if (e.passCompletes !== undefined) {
      if (e.passCompletes === 0) return;
      if (f.type === 'C' || f.type === 'I') e.passCompletes--;
    }
    this.noteCommand(f);
    this.toClient.push(f.bytes);
  }

  /** An ErrorResponse to a writer's Query: the fence's own (stale), or the writer's with its position moved back. */
  private queryError(f: Frame, e: Expect): Buffer {
    const fields = parseErrorFields(f.body);
    if ((e.swallowLeading ?? 0) > 0 || e.passCompletes === 0) {
      e.swallowLeading = 0;
      if (fields.get('C') === STALE_TOKEN) {
        const stale = staleDetail(fields.get('D'));
        if (stale) this.opts.onStale(stale);
      }
      return f.bytes;
    }
    const position = Number(fields.get('P'));
    if (e.shift === undefined || !Number.isInteger(position)) return f.bytes;
    fields.set('P', String(Math.max(1, position - e.shift)));
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
      this.toClient.push(this.queryError(f, head));
      return; // a simple Query ends with its ReadyForQuery
    }
    this.toClient.push(f.bytes);
    if (head === undefined) return; // e.g. FATAL at shutdown: the socket closes next
    if (head.injected) {
      const fields = parseErrorFields(f.body);
      if (head.kind === 'parse' || head.kind === 'close') this.prepared = false;
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
  }
}
