// The session's plumbing after startup: the writer's bytes go to its backend as they came, and the
// backend's messages to the writer as they came. The proxy sends nothing of its own into the
// session and holds nothing back, with one exception: how the session ends when the writer did not
// end it (the backend terminated by a newer leader's raise: FP409 as the answer to the writer's
// next request; lost with a request in flight: 08007, its outcome unknown; lost otherwise: 08006).
//
// What the relay reads, it reads from the database's answers (never by predicting the writer):
// message types to count the fenced transactions (tally.ts), and a FATAL the backend sends before
// it goes. From the writer it reads only message types: its Query and Sync messages, each of which
// the backend answers with one ReadyForQuery, and whether it sent anything since its last Sync (an
// Execute among it), so it knows whether a request was in flight when the backend went and whether
// the writer waits for an answer (a Flush waits with no Sync).
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { Outbox, bodyByte, type MessageReader, type Frame } from './wire/framing.ts';
import { errorResponse, frameTag, isFatal, parseErrorFields, readyForQuery, type ErrorFields } from './wire/backend.ts';
import { SQLSTATE } from '../../fence/index.ts';
import type { Backend } from './backend.ts';
import { TransactionTally, type TransactionEnd } from './tally.ts';

export type { TransactionEnd } from './tally.ts';

export interface RelayOptions {
  logger: Logger;
  /** Each transaction's end, once (metrics: fencepost_writes_total{door="sql"}; accepted counts); absent: not counted. */
  onTransactionEnd?: (end: TransactionEnd) => void;
  /**
   * The backend went away: why, if the session can tell (a newer leader's raise ended it: the writer
   * gets that instead of Postgres's words), else null. `terminated`: it said 57P01 first.
   */
  lostReason: (terminated: boolean) => Promise<ErrorFields | null>;
  onClose: () => void;
}

const MAX_LENGTH = 0x7fffffff;

/** Extended-protocol messages, answered only at a Sync (or a Flush): Parse, Bind, Describe, Execute, Close, Flush. */
const EXTENDED = new Set([0x50, 0x42, 0x44, 0x45, 0x43, 0x48]);

/**
 * Counts the writer's Query ('Q'), Sync ('S') and FunctionCall ('F') messages in its byte stream,
 * walking only the message headers: each is answered by one ReadyForQuery. Also sees a Terminate
 * ('X'), and extended-protocol messages sent since the last Sync (after a Flush a writer waits
 * for their answers with no Sync, as postgres.js does before its first Bind).
 */
class RequestCounter {
  requests = 0;
  terminated = false;
  /** Extended-protocol messages (EXTENDED) came after the last Query, Sync or FunctionCall. */
  unsynced = false;
  /** An Execute came after the last Sync: a statement (a COMMIT among them) may be running. */
  executing = false;
  private skip = 0;
  private readonly head = Buffer.alloc(5);
  private have = 0;

  /** Throws on a length no message has. */
  feed(c: Buffer): void {
    let i = 0;
    while (i < c.length) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, c.length - i);
        i += n;
        this.skip -= n;
        continue;
      }
      let type: number;
      let len: number;
      if (this.have === 0 && c.length - i >= 5) {
        type = c[i]!;
        len = c.readInt32BE(i + 1);
        i += 5;
      } else {
        while (this.have < 5 && i < c.length) this.head[this.have++] = c[i++]!;
        if (this.have < 5) return;
        this.have = 0;
        type = this.head[0]!;
        len = this.head.readInt32BE(1);
      }
      if (len < 4 || len > MAX_LENGTH) throw new Error(`message length ${len} out of range`);
      if (type === 0x51 /* Q */ || type === 0x53 /* S */ || type === 0x46 /* F: FunctionCall */) {
        this.requests++;
        this.unsynced = false;
        this.executing = false;
      } else if (type === 0x58 /* X */) this.terminated = true;
      else if (EXTENDED.has(type)) {
        this.unsynced = true;
        if (type === 0x45 /* E */) this.executing = true;
      }
      // CopyData, CopyDone and CopyFail belong to the request that started the COPY.
      this.skip = len - 4;
    }
  }
}

export class Relay {
  private readonly toClient = new Outbox();
  private readonly tally: TransactionTally | null;
  private readonly counter = new RequestCounter();
  /** ReadyForQuery messages the backend sent. */
  private readies = 0;
  /** A FATAL the backend sent: it goes away next; what the writer hears is decided then. */
  private fatal: Frame | null = null;
  private closed = false;
  /** The backend is gone; what the writer hears is being decided. */
  private losing = false;
  /** The writer sent something since the backend went: it waits for an answer. */
  private spokeWhileLosing = false;

  constructor(
    private readonly client: Socket,
    private readonly clientReader: MessageReader,
    private readonly backend: Backend,
    private readonly opts: RelayOptions,
  ) {
    this.tally = opts.onTransactionEnd ? new TransactionTally(opts.onTransactionEnd) : null;
  }

  /** Starts relaying: what the writer sent during startup first, then both ways as it comes. */
  start(): void {
    const early = this.clientReader.drain();
    this.client.on('data', (chunk: Buffer) => this.onClientData(chunk));
    this.backend.socket.on('data', (chunk: Buffer) => this.onBackendData(chunk));
    this.client.on('close', () => this.close());
    this.client.on('error', () => this.close());
    this.backend.socket.on('error', () => void this.backendLost());
    this.backend.socket.on('close', () => void this.backendLost());
    this.client.on('drain', () => this.backend.socket.resume());
    this.backend.socket.on('drain', () => this.client.resume());
    for (const chunk of early) this.onClientData(chunk);
    this.onBackendData(Buffer.alloc(0));
    this.client.resume();
  }

  /**
   * Ends the session now: its backend goes, and the writer's next request is answered `fields`
   * (deposed); a request in flight is answered 08007 instead (it may have committed).
   */
  revoke(fields: ErrorFields): void {
    if (this.closed || this.losing) return;
    this.losing = true;
    this.backend.socket.destroy();
    if (this.inFlight()) this.deposed(lostInFlight(), true);
    else this.deposed(fields, this.awaiting());
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.tally?.end(this.losing ? 'error' : 'rolled_back');
    this.backend.socket.destroy();
    // A last message written with end() (an error the writer must read) goes out before the
    // socket closes; bytes the writer still sends are read and dropped meanwhile (closing with
    // them unread would reset the connection, and the writer could drop the error unread).
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

  /** A request of the writer's has no ReadyForQuery yet, or an Execute of its has no Sync yet. */
  private inFlight(): boolean {
    return this.counter.requests > this.readies || this.counter.executing;
  }

  /**
   * The writer may be waiting for an answer: a request in flight, or messages since its last Sync
   * (after a Flush it waits with no Sync; without one, answering early only tells it sooner).
   */
  private awaiting(): boolean {
    return this.inFlight() || this.counter.unsynced;
  }

  private endWith(fields: ErrorFields | Buffer): void {
    if (!this.client.destroyed && !this.counter.terminated) this.client.end(Buffer.isBuffer(fields) ? fields : errorResponse(fields));
    this.close();
  }

  private onClientData(chunk: Buffer): void {
    if (this.closed) return;
    if (this.losing) {
      // The backend is gone: nothing goes on; the writer is owed an answer (backendLost).
      this.spokeWhileLosing = true;
      return;
    }
    try {
      this.counter.feed(chunk);
    } catch (err) {
      this.opts.logger.warn({ err }, 'SQL session closed: malformed message from the client');
      this.endWith({ severity: 'FATAL', code: SQLSTATE.PROTOCOL_VIOLATION, message: 'malformed message from the client' });
      return;
    }
    if (!this.backend.socket.write(chunk)) this.client.pause();
  }

  private onBackendData(chunk: Buffer): void {
    if (this.closed) return;
    const reader = this.backend.reader;
    try {
      if (chunk.length > 0) reader.push(chunk);
      for (let f = reader.next(); f !== null; f = reader.next()) this.onBackendFrame(f);
    } catch (err) {
      this.opts.logger.warn({ err }, 'SQL session closed: malformed message from the database');
      this.losing = true;
      this.backend.socket.destroy();
      this.endWith({ severity: 'FATAL', code: SQLSTATE.PROTOCOL_VIOLATION, message: 'malformed message from the database' });
      return;
    }
    if (this.toClient.empty || this.client.destroyed) return;
    if (!this.client.write(this.toClient.take()!)) this.backend.socket.pause();
  }

  private onBackendFrame(f: Frame): void {
    if (this.fatal !== null) return; // the backend goes away; nothing after its FATAL is the writer's
    switch (f.type) {
      case 'Z':
        this.readies++;
        this.tally?.ready(bodyByte(f, 0) ?? 0x49);
        break;
      case 'C': {
        if (this.tally === null) break;
        // Only COMMIT and ROLLBACK matter: no other tag is decoded.
        const first = bodyByte(f, 0);
        this.tally.command(first === 0x43 /* C */ || first === 0x52 /* R */ ? frameTag(f) : null);
        break;
      }
      case 'E':
        if (isFatal(f.body)) {
          this.fatal = f;
          return;
        }
        this.tally?.error();
        break;
      default:
    }
    this.toClient.frame(f);
  }

  /**
   * The backend is gone (a raise ended it, writes are refused, it was lost): the writer's next
   * answer is `reason`, as an ERROR and a ReadyForQuery (libpq keeps an error's SQLSTATE only when
   * the connection outlives it), then the connection closes. A request in flight (`awaited`) is
   * answered at once; an idle writer when it next speaks (a pooled connection: at its next
   * checkout's query).
   */
  private deposed(reason: ErrorFields, awaited: boolean): void {
    const answer = Buffer.concat([errorResponse({ ...reason, severity: 'ERROR' }), readyForQuery('I')]);
    if (awaited) {
      this.endWith(answer);
      return;
    }
    const timer = setTimeout(() => this.endWith(reason), DEPOSED_REPLY_WAIT_MS);
    timer.unref();
    this.client.removeAllListeners('data');
    this.client.once('data', () => {
      clearTimeout(timer);
      this.endWith(answer);
    });
    this.client.once('close', () => clearTimeout(timer));
    this.client.resume();
  }

  /** The backend is gone (it closed, or its socket failed): tell the writer why, once known, and close. */
  private async backendLost(): Promise<void> {
    if (this.closed || this.losing) return;
    this.losing = true;
    if (this.counter.terminated) {
      this.close(); // the writer said goodbye: it waits for nothing
      return;
    }
    const inFlight = this.inFlight();
    const awaiting = this.awaiting();
    const fatal = this.fatal;
    const fields = fatal === null ? null : parseErrorFields(fatal.body);
    let reason: ErrorFields | null = null;
    try {
      reason = await this.opts.lostReason(fields?.get('C') === SQLSTATE.ADMIN_SHUTDOWN);
    } catch (err) {
      this.opts.logger.warn({ err }, 'SQL session: could not tell why its database connection went');
    }
    if (this.closed) return;
    const awaited = awaiting || this.spokeWhileLosing;
    if (reason !== null) this.deposed(reason, awaited);
    else if (fatal !== null)
      this.endWith(Buffer.from(fatal.bytes)); // Postgres's own words, as straight
    else if (inFlight) this.deposed(lostInFlight(), true);
    else this.deposed({ severity: 'FATAL', code: SQLSTATE.CONNECTION_FAILURE, message: 'the database connection was lost' }, awaited);
  }
}

/** How long a session whose backend a raise ended waits for the writer's next message, to answer it. */
const DEPOSED_REPLY_WAIT_MS = 10 * 60_000;

function lostInFlight(): ErrorFields {
  return {
    severity: 'FATAL',
    code: SQLSTATE.TRANSACTION_RESOLUTION_UNKNOWN,
    message: 'the database connection was lost with a request in flight',
    hint: 'a COMMIT among what was in flight may or may not have committed: check before you retry',
  };
}
