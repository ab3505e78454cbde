// PostgreSQL protocol 3.0 framing: splitting a byte stream into messages, and building the few
// messages the proxy writes itself. Messages are 1 type byte + 4 length bytes (the length counts
// itself, not the type byte); the startup phase has no type byte. Forwarded messages stay the
// bytes they arrived as (subarrays of the chunk, never decoded and re-encoded).
//
// Not pg-protocol (parses backend messages only and decodes rows, so it cannot forward) nor
// pg-gateway (0.2.4 mis-frames a read holding more than one message; 0.3.0-beta answers startup
// itself): see issue 15's findings.

/** Larger messages are refused: the peer is broken or hostile (Postgres's own limit is 1 GB). */
export const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** The startup phase is small: user, database, a handful of parameters. */
export const MAX_STARTUP_BYTES = 10_000;

export interface Frame {
  /** The type byte as a character ('Q', 'P', …); '' for startup-phase packets. */
  type: string;
  /** The whole message, type and length included (forward as is). */
  bytes: Buffer;
  /** The body after the length. */
  body: Buffer;
}

export class FramingError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FramingError';
  }
}

/** Splits a stream into frames; feed chunks in, take whole frames out. */
export class MessageReader {
  private buf: Buffer = Buffer.alloc(0);
  /** Startup-phase packets (no type byte) until set to false. */
  startup: boolean;

  constructor(startup = false) {
    this.startup = startup;
  }

  push(chunk: Buffer): void {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
  }

  /** Bytes received but not yet framed. */
  get pending(): number {
    return this.buf.length;
  }

  /** The next whole frame, or null when more bytes are needed. Throws FramingError on a bad length. */
  next(): Frame | null {
    const head = this.startup ? 0 : 1;
    if (this.buf.length < head + 4) return null;
    const len = this.buf.readInt32BE(head);
    const max = this.startup ? MAX_STARTUP_BYTES : MAX_MESSAGE_BYTES;
    if (len < 4 || len > max) throw new FramingError(`message length ${len} out of range`);
    const total = head + len;
    if (this.buf.length < total) return null;
    const bytes = this.buf.subarray(0, total);
    this.buf = this.buf.subarray(total);
    return { type: this.startup ? '' : String.fromCharCode(bytes[0]!), bytes, body: bytes.subarray(head + 4) };
  }
}

/** Reads fields of a message body in order. */
export class BodyReader {
  private pos = 0;
  constructor(private readonly body: Buffer) {}

  int16(): number {
    this.need(2);
    const v = this.body.readInt16BE(this.pos);
    this.pos += 2;
    return v;
  }

  int32(): number {
    this.need(4);
    const v = this.body.readInt32BE(this.pos);
    this.pos += 4;
    return v;
  }

  cstring(): string {
    const end = this.body.indexOf(0, this.pos);
    if (end < 0) throw new FramingError('unterminated string');
    const s = this.body.toString('utf8', this.pos, end);
    this.pos = end + 1;
    return s;
  }

  bytes(n: number): Buffer {
    this.need(n);
    const b = this.body.subarray(this.pos, this.pos + n);
    this.pos += n;
    return b;
  }

  rest(): Buffer {
    const b = this.body.subarray(this.pos);
    this.pos = this.body.length;
    return b;
  }

  get done(): boolean {
    return this.pos >= this.body.length;
  }

  private need(n: number): void {
    if (this.pos + n > this.body.length) throw new FramingError('message too short');
  }
}

/** Builds one message: `type` ('' for startup packets) and its body parts. */
export function message(type: string, ...parts: (Buffer | string | number)[]): Buffer {
  const bufs = parts.map((p) => (typeof p === 'number' ? int32(p) : typeof p === 'string' ? cstr(p) : p));
  const bodyLen = bufs.reduce((n, b) => n + b.length, 0);
  const head = Buffer.alloc(type === '' ? 4 : 5);
  if (type !== '') head.write(type, 0, 'latin1');
  head.writeInt32BE(bodyLen + 4, type === '' ? 0 : 1);
  return Buffer.concat([head, ...bufs]);
}

export function int32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n);
  return b;
}

export function int16(n: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeInt16BE(n);
  return b;
}

/** A NUL-terminated UTF-8 string. */
export function cstr(s: string): Buffer {
  return Buffer.from(`${s}\u0000`, 'utf8');
}

// ---- fields of ErrorResponse / NoticeResponse ---------------------------------------------------

export interface ErrorFields {
  severity: 'ERROR' | 'FATAL' | 'PANIC' | 'WARNING' | 'NOTICE';
  code: string;
  message: string;
  detail?: string;
  hint?: string;
}

/** An ErrorResponse ('E') the proxy writes itself. */
export function errorResponse(f: ErrorFields): Buffer {
  const parts: Buffer[] = [Buffer.from('S'), cstr(f.severity), Buffer.from('V'), cstr(f.severity), Buffer.from('C'), cstr(f.code), Buffer.from('M'), cstr(f.message)];
  if (f.detail !== undefined) parts.push(Buffer.from('D'), cstr(f.detail));
  if (f.hint !== undefined) parts.push(Buffer.from('H'), cstr(f.hint));
  parts.push(Buffer.from([0]));
  return message('E', ...parts);
}

/** The fields of an ErrorResponse or NoticeResponse body, by their one-letter codes. */
export function parseErrorFields(body: Buffer): Map<string, string> {
  const fields = new Map<string, string>();
  let pos = 0;
  while (pos < body.length && body[pos] !== 0) {
    const code = String.fromCharCode(body[pos]!);
    const end = body.indexOf(0, pos + 1);
    if (end < 0) break;
    fields.set(code, body.toString('utf8', pos + 1, end));
    pos = end + 1;
  }
  return fields;
}

export const readyForQuery = (status: string): Buffer => message('Z', Buffer.from(status, 'latin1'));
export const authenticationOk = (): Buffer => message('R', 0);
export const parameterStatus = (name: string, value: string): Buffer => message('S', name, value);
export const backendKeyData = (pid: number, secret: number): Buffer => message('K', pid, secret);
