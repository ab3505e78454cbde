// Backend messages: the fields the proxy reads from Postgres's (and its own) answers, and every
// backend message the proxy writes itself.
import { ReadFrame, cstr, cstringAt, message, nulAt, type Frame } from './framing.ts';
import { PROTOCOL_3_0 } from './frontend.ts';

// ---- what the proxy reads -----------------------------------------------------------------------

/** A CommandComplete's tag, from its body. */
export function commandTag(body: Buffer): string {
  const end = nulAt(body, 0);
  return end <= 0 ? '' : body.toString('utf8', 0, end);
}

/** A CommandComplete's tag, from the frame as read (not cutting it). */
export function frameTag(f: Frame): string {
  if (!(f instanceof ReadFrame)) return commandTag(f.body);
  const start = f.start + 5;
  const end = nulAt(f.chunk, start, f.end);
  return end <= start ? '' : f.chunk.toString('utf8', start, end);
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

/** An ErrorResponse body whose severity ends the session (FATAL, PANIC). */
export function isFatal(body: Buffer): boolean {
  const fields = parseErrorFields(body);
  const severity = fields.get('V') ?? fields.get('S');
  return severity === 'FATAL' || severity === 'PANIC';
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

/** Messages the proxy sends often (ReadyForQuery after each answered request), made once; never written to. */
const made = new Map<string, Buffer>();
const madeOnce = (key: string, make: () => Buffer): Buffer => {
  let b = made.get(key);
  if (b === undefined) {
    b = make();
    if (made.size < 64) made.set(key, b);
  }
  return b;
};

export const readyForQuery = (status: string): Buffer => madeOnce(`Z${status}`, () => message('Z', Buffer.from(status, 'latin1')));
export const authenticationOk = (): Buffer => message('R', 0);
export const authenticationCleartextPassword = (): Buffer => message('R', 3);
/** AuthenticationSASL: the mechanisms offered. */
export const authenticationSasl = (...mechanisms: string[]): Buffer => message('R', 10, ...mechanisms, Buffer.from([0]));
export const authenticationSaslContinue = (data: string): Buffer => message('R', 11, Buffer.from(data, 'utf8'));
export const authenticationSaslFinal = (data: string): Buffer => message('R', 12, Buffer.from(data, 'utf8'));
export const parameterStatus = (name: string, value: string): Buffer => message('S', name, value);
export const backendKeyData = (pid: number, secret: number): Buffer => message('K', pid, secret);

/** NegotiateProtocolVersion: we speak 3.0 and none of the `_pq_.` options asked for. */
export function negotiateProtocolVersion(unsupported: readonly string[]): Buffer {
  return message('v', PROTOCOL_3_0 & 0xffff, unsupported.length, ...unsupported);
}
