// PostgreSQL protocol 3.0 framing: a byte stream split into messages, the fields of a body read in
// order, and the primitives messages are built from. Messages are 1 type byte + 4 length bytes (the
// length counts itself, not the type byte); the startup phase has no type byte. Forwarded messages
// stay the bytes they arrived as (subarrays of the chunk, never decoded and re-encoded).
//
// Framing is not pg-protocol's (its parser reads backend messages only and decodes rows, so it
// cannot forward) nor pg-gateway's (0.2.4 mis-frames a read holding more than one message;
// 0.3.0-beta answers startup itself).
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

/** The NUL-terminated string at `start` ('' when unterminated) and where the next field starts. */
export function cstringAt(body: Buffer, start: number): { value: string; end: number } {
  const end = body.indexOf(0, start);
  if (end < 0) return { value: '', end: body.length };
  return { value: body.toString('utf8', start, end), end: end + 1 };
}
