// The startup phase's connection: one message at a time, bounded, within a deadline, with the TLS
// upgrade in the middle; and the refusals that end the phase.
//
// The socket is paused while a framed message waits to be taken (and while the listener waits for
// the backend), so what a client sends ahead (a Terminate in the same write as its startup packet,
// a pipelined query) stays in `reader` for the session, and no more than one chunk past the awaited
// message is buffered. Each message is bounded before it is buffered: a startup packet by
// MAX_STARTUP_BYTES (as Postgres's), what follows it here (password and SASL messages) by
// MAX_AUTH_MESSAGE_BYTES; a longer length is refused as soon as its header is in.
import type { Socket } from 'node:net';
import { TLSSocket, type SecureContext } from 'node:tls';
import { MAX_STARTUP_BYTES, MessageReader, type Frame } from './wire/framing.ts';
import { negotiatesEncryption } from './wire/frontend.ts';
import type { ErrorFields } from './wire/backend.ts';
import { SQLSTATE } from '../../fence/index.ts';

/** The most bytes of a password or SASL message (a SCRAM message is a few hundred). */
const MAX_AUTH_MESSAGE_BYTES = 8192;

/** The startup ends with this FATAL to the client. */
export class Refusal extends Error {
  constructor(readonly fields: ErrorFields) {
    super(fields.message);
  }
}

export const refuse = (code: string, msg: string, detail?: string): Refusal =>
  new Refusal({ severity: 'FATAL', code, message: msg, ...(detail !== undefined ? { detail } : {}) });

/** The client sent Terminate during authentication: it is gone, nothing to answer. */
export class ClientLeft extends Error {}

export class StartupChannel {
  /** The client's socket: the raw one, or the TLS one over it once upgraded. */
  socket: Socket;
  /** What the client sent and the phase did not take: the session reads on from it. */
  readonly reader = new MessageReader(true);
  readonly deadline: number;
  encrypted = false;
  private framed: Frame | null = null;
  private wake: (() => void) | null = null;
  private ended = false;
  private problem: Refusal | null = null;
  private readonly timer: NodeJS.Timeout;
  private readonly onData = (chunk: Buffer) => {
    this.reader.push(chunk);
    this.pull();
    if (this.framed !== null || this.problem !== null) this.socket.pause();
    this.wake?.();
  };
  private readonly onEnd = () => {
    this.ended = true;
    this.wake?.();
  };

  constructor(raw: Socket, timeoutMs: number) {
    this.socket = raw;
    this.deadline = Date.now() + timeoutMs;
    this.timer = setTimeout(this.onEnd, timeoutMs);
    this.attach();
  }

  /** Milliseconds left of the phase (at least 1). */
  remaining(): number {
    return Math.max(1, this.deadline - Date.now());
  }

  /** The next message; a refusal when it is malformed, too long, late, or the client left. */
  async next(): Promise<Frame> {
    for (;;) {
      this.pull();
      if (this.problem !== null) throw this.problem;
      const f = this.framed;
      if (f !== null) {
        this.framed = null;
        return f;
      }
      if (this.ended || Date.now() >= this.deadline)
        throw refuse(SQLSTATE.CONNECTION_FAILURE, 'startup did not finish in time or the client went away');
      this.socket.resume();
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = null;
    }
  }

  /**
   * Answers an SSLRequest 'S' and goes on over TLS. Nothing may follow the SSLRequest before the
   * handshake: such bytes were sent in the clear, and must not be read as if they came over TLS.
   */
  upgrade(context: SecureContext): TLSSocket {
    if (this.reader.pending > 0 || this.framed !== null)
      throw refuse(SQLSTATE.PROTOCOL_VIOLATION, 'received unencrypted data after SSL request');
    this.detach();
    this.socket.resume(); // the TLS socket reads the raw one from here
    this.socket.write('S');
    const secure = new TLSSocket(this.socket, { isServer: true, secureContext: context });
    secure.on('error', () => {}); // a failed handshake closes it: 'close' ends the startup
    secure.setNoDelay(true);
    this.socket = secure;
    this.encrypted = true;
    this.attach();
    return secure;
  }

  /** The phase is over: the socket is the session's (or closed). Unread bytes stay in `reader`. */
  release(): void {
    this.detach();
    clearTimeout(this.timer);
  }

  private attach(): void {
    this.socket.on('data', this.onData);
    this.socket.on('close', this.onEnd);
  }

  private detach(): void {
    this.socket.off('data', this.onData);
    this.socket.off('close', this.onEnd);
  }

  private pull(): void {
    if (this.framed !== null || this.problem !== null) return;
    const untyped = this.reader.startup;
    try {
      const f = this.reader.next(untyped ? MAX_STARTUP_BYTES : MAX_AUTH_MESSAGE_BYTES);
      if (f === null) return;
      // A StartupMessage (or CancelRequest) ends the untyped phase: what follows is typed.
      if (untyped && !negotiatesEncryption(f.body)) this.reader.startup = false;
      this.framed = f;
    } catch (err) {
      this.problem = refuse(
        SQLSTATE.PROTOCOL_VIOLATION,
        `${untyped ? 'invalid startup packet' : 'invalid authentication message'}: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
  }
}
