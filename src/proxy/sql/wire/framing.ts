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
  readonly type: string;
  /** The whole message, type and length included (forward as is). */
  readonly bytes: Buffer;
  /** The body after the length. */
  readonly body: Buffer;
}

/**
 * A frame as MessageReader makes it: where it lies in the chunk it was read in; its bytes and body
 * are cut from the chunk when first asked for (a forwarded frame is written with its neighbours
 * as one piece of the chunk, Outbox, and most are never cut: a Buffer made per frame was the
 * largest cost of relaying one, bench/log/2026-12-06-proxy-cpu.md).
 */
export class ReadFrame implements Frame {
  private cutBytes: Buffer | null = null;
  private cutBody: Buffer | null = null;
  constructor(
    readonly type: string,
    readonly chunk: Buffer,
    readonly start: number,
    readonly end: number,
    private readonly head: number,
  ) {}

  get bytes(): Buffer {
    return (this.cutBytes ??= this.start === 0 && this.end === this.chunk.length ? this.chunk : this.chunk.subarray(this.start, this.end));
  }

  get body(): Buffer {
    return (this.cutBody ??= this.chunk.subarray(this.start + this.head, this.end));
  }
}

/** The body's byte at `i` (undefined past its end), not cutting the frame. */
export function bodyByte(f: Frame, i: number): number | undefined {
  if (!(f instanceof ReadFrame)) return f.body[i];
  const at = f.start + 5 + i;
  return at < f.end ? f.chunk[at] : undefined;
}

/**
 * Bytes to write to a socket, in order: buffers, and frames as read. Frames that lie side by side
 * in one chunk (forwarded in the order they came) are kept as one run of it, and written as one
 * view of the chunk, not copied. (Neither a read's chunk nor a built message is written to after it
 * is made, so a view holds what a copy would.)
 */
export class Outbox {
  private parts: Buffer[] = [];
  private runChunk: Buffer | null = null;
  private runStart = 0;
  private runEnd = 0;

  get empty(): boolean {
    return this.runChunk === null && this.parts.length === 0;
  }

  push(bytes: Buffer): void {
    if (this.runChunk !== null) this.endRun();
    this.parts.push(bytes);
  }

  pushAll(list: readonly Buffer[]): void {
    for (const b of list) this.push(b);
  }

  /** A frame as it came. */
  frame(f: Frame): void {
    if (!(f instanceof ReadFrame)) {
      this.push(f.bytes);
      return;
    }
    if (this.runChunk === f.chunk && this.runEnd === f.start) {
      this.runEnd = f.end;
      return;
    }
    if (this.runChunk !== null) this.endRun();
    this.runChunk = f.chunk;
    this.runStart = f.start;
    this.runEnd = f.end;
  }

  /** Everything as one buffer (null: nothing), and empty again. */
  take(): Buffer | null {
    if (this.runChunk !== null) this.endRun();
    const parts = this.parts;
    if (parts.length === 0) return null;
    this.parts = [];
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
  }

  private endRun(): void {
    const c = this.runChunk!;
    this.parts.push(this.runStart === 0 && this.runEnd === c.length ? c : c.subarray(this.runStart, this.runEnd));
    this.runChunk = null;
  }
}

/** One-character strings of the type bytes, made once. */
const TYPE_CHARS = Array.from({ length: 256 }, (_, i) => String.fromCharCode(i));

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
  /** Where the bytes not yet framed start in chunks[0] (a chunk holding several frames is not cut up per frame). */
  private at = 0;
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

  /** The bytes received and not yet framed, as they came; the reader is empty after. */
  drain(): Buffer[] {
    const out = this.chunks.map((c, i) => (i === 0 && this.at > 0 ? c.subarray(this.at) : c));
    this.chunks = [];
    this.at = 0;
    this.size = 0;
    return out;
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
    if (len < 4 || len > maxBytes) throw new FramingError(`message length ${len} out of range`);
    const total = head + len;
    if (this.size < total) return null;
    const first = this.gather(total);
    const from = this.at;
    const to = from + total;
    if (to === first.length) {
      this.chunks.shift();
      this.at = 0;
    } else {
      this.at = to;
    }
    this.size -= total;
    return new ReadFrame(this.startup ? '' : TYPE_CHARS[first[from]!]!, first, from, to, head + 4);
  }

  /** The big-endian int32 `offset` bytes into what is not framed yet, read across chunks without joining them. */
  private int32At(offset: number): number {
    const first = this.chunks[0]!;
    const p = this.at + offset;
    if (first.length >= p + 4) return first.readInt32BE(p);
    const b = Buffer.alloc(4);
    let i = 0;
    let pos = -this.at;
    for (const c of this.chunks) {
      for (let j = 0; j < c.length && i < 4; j++, pos++) if (pos >= offset) b[i++] = c[j]!;
      if (i === 4) break;
    }
    return b.readInt32BE(0);
  }

  /** The first chunk, joined with as many following ones as it takes to hold `n` bytes past `at`. */
  private gather(n: number): Buffer {
    const first = this.chunks[0]!;
    if (first.length - this.at >= n) return first;
    let k = 1;
    let have = first.length - this.at;
    while (have < n) have += this.chunks[k++]!.length;
    const joined = Buffer.concat([first.subarray(this.at), ...this.chunks.slice(1, k)], have);
    this.chunks.splice(0, k, joined);
    this.at = 0;
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
export function cstringAt(body: Buffer, start: number, limit = body.length): { value: string; end: number } {
  const end = nulAt(body, start, limit);
  if (end < 0) return { value: '', end: limit };
  return { value: end === start ? '' : body.toString('utf8', start, end), end: end + 1 };
}

/**
 * Where the first NUL at or after `start` is, -1 if none. Names and command tags are short: a loop
 * finds their end sooner than indexOf's call into C++ does; longer strings (statement text) get indexOf.
 */
export function nulAt(body: Buffer, start: number, limit = body.length): number {
  const stop = Math.min(limit, start + 64);
  for (let i = start; i < stop; i++) if (body[i] === 0) return i;
  if (stop === limit) return -1;
  const at = body.indexOf(0, stop);
  return at < limit ? at : -1;
}
