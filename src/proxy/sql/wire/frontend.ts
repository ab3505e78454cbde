// Frontend messages: those a writer sends, read into typed objects (startup packets included), and
// those the proxy sends to Postgres, built from typed objects. pg-protocol's `serialize` builds
// the ones it frames as the proxy means them (not Bind: see encode).
import { serialize } from 'pg-protocol';
import { BodyReader, FramingError, ReadFrame, cstringAt, int16, int32, message, type Frame } from './framing.ts';

export const PROTOCOL_3_0 = 196608;
export const SSL_REQUEST = 80877103;
export const GSSENC_REQUEST = 80877104;
export const CANCEL_REQUEST = 80877102;

export type StartupPacket =
  | { kind: 'ssl' }
  | { kind: 'gssenc' }
  | { kind: 'cancel'; pid: number; secret: Buffer }
  | { kind: 'startup'; minor: number; params: Map<string, string> };

/** Decodes the body of a startup-phase packet (after its length). */
export function parseStartupPacket(body: Buffer): StartupPacket {
  const r = new BodyReader(body);
  const code = r.int32();
  if (code === SSL_REQUEST) return { kind: 'ssl' };
  if (code === GSSENC_REQUEST) return { kind: 'gssenc' };
  if (code === CANCEL_REQUEST) {
    const pid = r.int32();
    return { kind: 'cancel', pid, secret: Buffer.from(r.rest()) };
  }
  if (code >>> 16 !== 3) throw new FramingError(`unsupported protocol ${code >>> 16}.${code & 0xffff}`);
  const params = new Map<string, string>();
  for (;;) {
    const name = r.cstring();
    if (name === '') break;
    params.set(name, r.cstring());
  }
  return { kind: 'startup', minor: code & 0xffff, params };
}

/** An SSLRequest or GSSENCRequest: the untyped startup phase goes on after it. */
export function negotiatesEncryption(body: Buffer): boolean {
  if (body.length < 4) return false;
  const code = body.readInt32BE(0);
  return code === SSL_REQUEST || code === GSSENC_REQUEST;
}

// ---- what a writer sends ------------------------------------------------------------------------
// Read leniently: a string missing its NUL reads as '' and ends the body, a short list reads as far
// as it goes. A malformed message is still forwarded as it came, for the backend to refuse.

// Names of statements and portals are read as UTF-8 for show; the server tells them apart by their
// bytes (the first 63: NAMEDATALEN-1), and bytes that are not UTF-8 read alike ('\ufffd'), so each
// name also comes as sent (`…Bytes`, absent in messages built by hand: then the name's UTF-8).
export type ClientMessage =
  /** `raw`: the text's bytes as sent, in the session's client encoding (`text` reads them as UTF-8). */
  | { type: 'query'; text: string; raw?: Buffer }
  | { type: 'parse'; name: string; nameBytes?: Buffer; text: string; paramTypes: number[] }
  | {
      type: 'bind';
      portal: string;
      statement: string;
      portalBytes?: Buffer;
      statementBytes?: Buffer;
      paramFormats?: number;
      paramCount?: number;
    }
  /** `target`: 'S' a prepared statement, 'P' a portal. */
  | { type: 'describe'; target: string; name: string; nameBytes?: Buffer }
  | { type: 'execute'; portal: string; maxRows: number; portalBytes?: Buffer }
  | { type: 'close'; target: string; name: string; nameBytes?: Buffer }
  | { type: 'sync' }
  | { type: 'flush' }
  | { type: 'functionCall' }
  /** CopyData, CopyDone, CopyFail. */
  | { type: 'copy' }
  | { type: 'terminate' }
  /** `code`: the type byte of a message a client does not send after startup. */
  | { type: 'other'; code: string };

/**
 * A decoded message: every field of every kind present, in one order, so every message the relay
 * and the planner read has one hidden class (reads of `type` and the rest stay monomorphic, not
 * megamorphic across a dozen literal shapes). Read it as the ClientMessage its `type` names.
 */
class Decoded {
  text = '';
  raw: Buffer | undefined = undefined;
  name = '';
  nameBytes: Buffer | undefined = undefined;
  paramTypes: number[] | undefined = undefined;
  portal = '';
  statement = '';
  portalBytes: Buffer | undefined = undefined;
  statementBytes: Buffer | undefined = undefined;
  paramFormats = 0;
  paramCount = 0;
  target = '';
  maxRows = 0;
  code = '';
  constructor(readonly type: ClientMessage['type']) {}
}

/** The message of a frame from the client. */
export function decodeClient(f: Frame): ClientMessage {
  const m = new Decoded(kindOfType(f.type));
  if (m.type === 'other') {
    m.code = f.type;
    return m as ClientMessage;
  }
  if (m.type === 'sync' || m.type === 'flush' || m.type === 'copy' || m.type === 'terminate' || m.type === 'functionCall')
    return m as ClientMessage;
  switch (m.type) {
    case 'query': {
      const body = f.body;
      const nul = body.indexOf(0);
      m.text = cstringAt(body, 0).value;
      m.raw = body.subarray(0, nul < 0 ? 0 : nul);
      break;
    }
    case 'parse': {
      const body = f.body;
      const name = cstringAt(body, 0);
      const text = cstringAt(body, name.end);
      const paramTypes: number[] = [];
      const count = text.end + 2 <= body.length ? body.readInt16BE(text.end) : 0;
      for (let i = 0, at = text.end + 2; i < count && at + 4 <= body.length; i++, at += 4) paramTypes.push(body.readInt32BE(at));
      m.name = name.value;
      m.nameBytes = bytesOf(body, 0, name.end);
      m.text = text.value;
      m.paramTypes = paramTypes;
      break;
    }
    case 'bind': {
      // Read where the frame lies in its chunk (not cut from it: one Bind per statement run).
      const { buf, base, lim } = placeOf(f);
      const portal = cstringAt(buf, base, lim);
      const statement = cstringAt(buf, portal.end, lim);
      // After the names: the parameter format codes, then the parameter count.
      let at = statement.end;
      const formats = at + 2 <= lim ? buf.readInt16BE(at) : 0;
      at += 2 + 2 * Math.max(0, formats);
      m.portal = portal.value;
      m.statement = statement.value;
      m.portalBytes = bytesOf(buf, base, portal.end, lim);
      m.statementBytes = bytesOf(buf, portal.end, statement.end, lim);
      m.paramFormats = formats;
      m.paramCount = at + 2 <= lim ? buf.readInt16BE(at) : -1;
      break;
    }
    case 'describe':
    case 'close': {
      const body = f.body;
      const name = cstringAt(body, 1);
      m.target = body.toString('latin1', 0, Math.min(1, body.length));
      m.name = name.value;
      m.nameBytes = bytesOf(body, 1, name.end);
      break;
    }
    case 'execute': {
      const { buf, base, lim } = placeOf(f);
      const portal = cstringAt(buf, base, lim);
      m.portal = portal.value;
      m.portalBytes = bytesOf(buf, base, portal.end, lim);
      m.maxRows = portal.end + 4 <= lim ? buf.readInt32BE(portal.end) : 0;
      break;
    }
  }
  return m as ClientMessage;
}

/** The kind of message a client's type byte stands for. */
function kindOfType(type: string): ClientMessage['type'] {
  switch (type) {
    case 'Q':
      return 'query';
    case 'P':
      return 'parse';
    case 'B':
      return 'bind';
    case 'D':
      return 'describe';
    case 'C':
      return 'close';
    case 'E':
      return 'execute';
    case 'S':
      return 'sync';
    case 'H':
      return 'flush';
    case 'F':
      return 'functionCall';
    case 'd':
    case 'c':
    case 'f':
      return 'copy';
    case 'X':
      return 'terminate';
    default:
      return 'other';
  }
}

const NO_BYTES = Buffer.alloc(0);

/** Where a frame's body lies: in its chunk from `base` up to `lim` as read, else its body. */
function placeOf(f: Frame): { buf: Buffer; base: number; lim: number } {
  if (f instanceof ReadFrame) return { buf: f.chunk, base: f.start + 5, lim: f.end };
  return { buf: f.body, base: 0, lim: f.body.length };
}

/**
 * The bytes of the C string at `start` that ends (past its NUL) at `end`, as cstringAt reads it
 * up to `limit` ('' without a NUL): a view of the message, not a copy (names are keyed as strings,
 * planner.ts key, never kept as bytes).
 */
function bytesOf(buf: Buffer, start: number, end: number, limit = buf.length): Buffer {
  if (start >= limit || buf[end - 1] !== 0 || end <= start) return NO_BYTES;
  return buf.subarray(start, end - 1);
}

// ---- what the proxy sends -----------------------------------------------------------------------

export type FrontendMessage =
  | { type: 'query'; text: string }
  | { type: 'parse'; name: string; text: string; paramTypes: readonly number[] }
  /** Text parameters (null: SQL NULL), text results. */
  | { type: 'bind'; portal: string; statement: string; values: readonly (string | null)[] }
  | { type: 'execute'; portal: string; maxRows: number }
  | { type: 'close'; target: 'S' | 'P'; name: string }
  | { type: 'sync' }
  | { type: 'flush' }
  /** PasswordMessage: a cleartext or md5 password. */
  | { type: 'password'; password: string }
  /** SASLInitialResponse: the mechanism and the client-first message. */
  | { type: 'saslInitial'; mechanism: string; data: string }
  /** SASLResponse: the client-final message. */
  | { type: 'saslResponse'; data: string }
  /** StartupMessage, protocol 3.0. */
  | { type: 'startup'; params: readonly (readonly [string, string])[] }
  | { type: 'sslRequest' }
  | { type: 'cancelRequest'; pid: number; secret: Buffer };

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
    case 'flush':
      return serialize.flush();
    case 'password':
      return message('p', m.password);
    case 'saslInitial': {
      const data = Buffer.from(m.data, 'utf8');
      return message('p', m.mechanism, data.length, data);
    }
    case 'saslResponse':
      return message('p', Buffer.from(m.data, 'utf8'));
    case 'startup':
      return message('', PROTOCOL_3_0, ...m.params.flat(), Buffer.from([0]));
    case 'sslRequest':
      return message('', SSL_REQUEST);
    case 'cancelRequest':
      return message('', CANCEL_REQUEST, m.pid, m.secret);
  }
}

function bindValue(value: string | null): Buffer {
  if (value === null) return int32(-1);
  const b = Buffer.from(value, 'utf8');
  return Buffer.concat([int32(b.length), b]);
}
