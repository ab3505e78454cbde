// PostgreSQL protocol 3.0 framing: splitting a byte stream into messages, the client messages the
// session reads as typed objects, and the messages the proxy writes itself. Messages are 1 type byte
// + 4 length bytes (the length counts itself, not the type byte); the startup phase has no type
// byte. Forwarded messages stay the bytes they arrived as (subarrays of the chunk, never decoded
// and re-encoded).
//
// Framing is not pg-protocol's (its parser reads backend messages only and decodes rows, so it
// cannot forward) nor pg-gateway's (0.2.4 mis-frames a read holding more than one message;
// 0.3.0-beta answers startup itself): see issue 15's findings. pg-protocol's `serialize` builds the
// frontend messages the proxy sends, except Bind (see encode).
import { serialize } from 'pg-protocol';

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

/**
 * Splits a stream into frames; feed chunks in, take whole frames out. The chunks wait in a list:
 * they are joined once, when a whole frame is in (a frame in one chunk is a subarray of it), so a
 * large message arriving in many chunks costs one copy, not one per chunk (joining on every push
 * copied a 4 MB message about 250 times over in 16 KB reads).
 */
export class MessageReader {
  private chunks: Buffer[] = [];
  private size = 0;
  /** Startup-phase packets (no type byte) until set to false. */
  startup: boolean;

  constructor(startup = false) {
    this.startup = startup;
  }

  push(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.size += chunk.length;
  }

  /** Bytes received but not yet framed. */
  get pending(): number {
    return this.size;
  }

  /**
   * The next whole frame, or null when more bytes are needed. Throws FramingError on a length
   * below 4 or above `maxBytes` (default: the phase's limit) as soon as the length is in.
   */
  next(maxBytes = this.startup ? MAX_STARTUP_BYTES : MAX_MESSAGE_BYTES): Frame | null {
    const head = this.startup ? 0 : 1;
    if (this.size < head + 4) return null;
    const len = this.int32At(head);
    const max = maxBytes;
    if (len < 4 || len > max) throw new FramingError(`message length ${len} out of range`);
    const total = head + len;
    if (this.size < total) return null;
    const first = this.gather(total);
    const bytes = first.subarray(0, total);
    if (first.length === total) this.chunks.shift();
    else this.chunks[0] = first.subarray(total);
    this.size -= total;
    return { type: this.startup ? '' : String.fromCharCode(bytes[0]!), bytes, body: bytes.subarray(head + 4) };
  }

  /** The big-endian int32 at `at`, read across chunks without joining them. */
  private int32At(at: number): number {
    const first = this.chunks[0]!;
    if (first.length >= at + 4) return first.readInt32BE(at);
    const b = Buffer.alloc(4);
    let i = 0;
    let pos = 0;
    for (const c of this.chunks) {
      for (let j = 0; j < c.length && i < 4; j++, pos++) if (pos >= at) b[i++] = c[j]!;
      if (i === 4) break;
    }
    return b.readInt32BE(0);
  }

  /** The first chunk, joined with as many following ones as it takes to hold `n` bytes. */
  private gather(n: number): Buffer {
    const first = this.chunks[0]!;
    if (first.length >= n) return first;
    let k = 0;
    let have = 0;
    while (have < n) have += this.chunks[k++]!.length;
    const joined = Buffer.concat(this.chunks.slice(0, k), have);
    this.chunks.splice(0, k, joined);
    return joined;
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

// ---- client messages the session reads ---------------------------------------------------------
// Read leniently: a string missing its NUL reads as '' and ends the body, a short list reads as far
// as it goes. A malformed message is still forwarded as it came, for the backend to refuse.

export type ClientMessage =
  | { type: 'query'; text: string }
  | { type: 'parse'; name: string; text: string; paramTypes: number[] }
  | { type: 'bind'; portal: string; statement: string }
  /** `target`: 'S' a prepared statement, 'P' a portal. */
  | { type: 'describe'; target: string; name: string }
  | { type: 'execute'; portal: string; maxRows: number }
  | { type: 'close'; target: string; name: string }
  | { type: 'sync' }
  | { type: 'flush' }
  | { type: 'functionCall' }
  /** CopyData, CopyDone, CopyFail. */
  | { type: 'copy' }
  | { type: 'terminate' }
  /** `code`: the type byte of a message a client does not send after startup. */
  | { type: 'other'; code: string };

/** The NUL-terminated string at `start` ('' when unterminated) and where the next field starts. */
function cstringAt(body: Buffer, start: number): { value: string; end: number } {
  const end = body.indexOf(0, start);
  if (end < 0) return { value: '', end: body.length };
  return { value: body.toString('utf8', start, end), end: end + 1 };
}

/** The message of a frame from the client. */
export function decodeClient(f: Frame): ClientMessage {
  const body = f.body;
  switch (f.type) {
    case 'Q':
      return { type: 'query', text: cstringAt(body, 0).value };
    case 'P': {
      const name = cstringAt(body, 0);
      const text = cstringAt(body, name.end);
      const paramTypes: number[] = [];
      const count = text.end + 2 <= body.length ? body.readInt16BE(text.end) : 0;
      for (let i = 0, at = text.end + 2; i < count && at + 4 <= body.length; i++, at += 4) paramTypes.push(body.readInt32BE(at));
      return { type: 'parse', name: name.value, text: text.value, paramTypes };
    }
    case 'B': {
      const portal = cstringAt(body, 0);
      return { type: 'bind', portal: portal.value, statement: cstringAt(body, portal.end).value };
    }
    case 'D':
    case 'C':
      return {
        type: f.type === 'D' ? 'describe' : 'close',
        target: body.toString('latin1', 0, Math.min(1, body.length)),
        name: cstringAt(body, 1).value,
      };
    case 'E': {
      const portal = cstringAt(body, 0);
      return { type: 'execute', portal: portal.value, maxRows: portal.end + 4 <= body.length ? body.readInt32BE(portal.end) : 0 };
    }
    case 'S':
      return { type: 'sync' };
    case 'H':
      return { type: 'flush' };
    case 'F':
      return { type: 'functionCall' };
    case 'd':
    case 'c':
    case 'f':
      return { type: 'copy' };
    case 'X':
      return { type: 'terminate' };
    default:
      return { type: 'other', code: f.type };
  }
}

// ---- frontend messages the proxy sends ----------------------------------------------------------

export type FrontendMessage =
  | { type: 'query'; text: string }
  | { type: 'parse'; name: string; text: string; paramTypes: readonly number[] }
  /** Text parameters (null: SQL NULL), text results. */
  | { type: 'bind'; portal: string; statement: string; values: readonly (string | null)[] }
  | { type: 'execute'; portal: string; maxRows: number }
  | { type: 'close'; target: 'S' | 'P'; name: string }
  | { type: 'sync' };

/** The bytes of a frontend message. */
export function encode(m: FrontendMessage): Buffer {
  switch (m.type) {
    case 'query':
      return serialize.query(m.text);
    case 'parse':
      return serialize.parse({ name: m.name, text: m.text, types: [...m.paramTypes] });
    case 'bind':
      // pg-protocol's bind sends a format code per parameter and one for all results; these send
      // none (all text, the default): the same meaning in other bytes, so Bind is framed here.
      return message('B', m.portal, m.statement, int16(0), int16(m.values.length), ...m.values.map(bindValue), int16(0));
    case 'execute':
      return serialize.execute({ portal: m.portal, rows: m.maxRows });
    case 'close':
      return serialize.close({ type: m.target, name: m.name });
    case 'sync':
      return serialize.sync();
  }
}

function bindValue(value: string | null): Buffer {
  if (value === null) return int32(-1);
  const b = Buffer.from(value, 'utf8');
  return Buffer.concat([int32(b.length), b]);
}

// ---- fields of backend messages the session reads -----------------------------------------------

/** A CommandComplete's tag. */
export function commandTag(body: Buffer): string {
  return cstringAt(body, 0).value;
}

/** A ParameterStatus's name and value. */
export function parameterOf(body: Buffer): { name: string; value: string } {
  const name = cstringAt(body, 0);
  return { name: name.value, value: cstringAt(body, name.end).value };
}

/** The text values of a DataRow (null as ''). */
export function dataRowTexts(body: Buffer): string[] {
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
  const parts: Buffer[] = [
    Buffer.from('S'),
    cstr(f.severity),
    Buffer.from('V'),
    cstr(f.severity),
    Buffer.from('C'),
    cstr(f.code),
    Buffer.from('M'),
    cstr(f.message),
  ];
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
