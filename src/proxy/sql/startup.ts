// The startup phase of a client connection: the first packet (SSLRequest, GSSENCRequest,
// CancelRequest or StartupMessage), the startup parameters, and the fencepost settings carried in
// `options` (`-c fencepost.token=42 -c fencepost.fence_key=orders`, i.e. PGOPTIONS).
import { BodyReader, FramingError, message } from './framing.ts';

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

/** NegotiateProtocolVersion: we speak 3.0 and none of the `_pq_.` options asked for. */
export function negotiateProtocolVersion(unsupported: readonly string[]): Buffer {
  return message('v', PROTOCOL_3_0 & 0xffff, unsupported.length, ...unsupported);
}

/**
 * Splits a libpq `options` value into its `-c name=value` / `--name=value` settings (backslash
 * escapes a space or backslash, as Postgres reads it). Other switches are ignored.
 */
export function parseOptions(options: string): Map<string, string> {
  const words: string[] = [];
  let cur = '';
  let inWord = false;
  for (let i = 0; i < options.length; i++) {
    const ch = options[i]!;
    if (ch === '\\' && i + 1 < options.length) {
      cur += options[++i];
      inWord = true;
    } else if (/\s/.test(ch)) {
      if (inWord) words.push(cur);
      cur = '';
      inWord = false;
    } else {
      cur += ch;
      inWord = true;
    }
  }
  if (inWord) words.push(cur);
  const settings = new Map<string, string>();
  for (let i = 0; i < words.length; i++) {
    const w = words[i]!;
    let setting: string | undefined;
    if (w === '-c') setting = words[++i];
    else if (w.startsWith('-c')) setting = w.slice(2);
    else if (w.startsWith('--')) setting = w.slice(2);
    if (setting === undefined) continue;
    const eq = setting.indexOf('=');
    if (eq <= 0) continue;
    settings.set(setting.slice(0, eq).replaceAll('-', '_').toLowerCase(), setting.slice(eq + 1));
  }
  return settings;
}

/** `-c name=value` for an options string, escaping what Postgres splits on. */
export function optionArg(name: string, value: string): string {
  return `-c ${name}=${value.replace(/[\\\s]/g, (c) => `\\${c}`)}`;
}

/**
 * Startup parameters passed on to the backend. Everything else a client sends (a
 * `default_transaction_read_only`, a `role`, …) is dropped: the proxy sets those itself.
 */
export const FORWARDED_PARAMETERS: ReadonlySet<string> = new Set([
  'application_name', 'client_encoding', 'datestyle', 'timezone', 'intervalstyle', 'extra_float_digits', 'search_path', 'bytea_output',
]);

/** The fencepost settings a session may carry in from its startup options. */
export const FENCE_SETTINGS: ReadonlySet<string> = new Set(['fencepost.token', 'fencepost.fence_key']);
