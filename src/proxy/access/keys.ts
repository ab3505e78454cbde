// Access keys, shared by both doors: keys configured by name with the fence-key prefixes they may
// write, the Postgres role their SQL transactions run as, or read-only; and the SCRAM secret the
// SQL endpoint's login checks.
//
// Only SHA-256 digests of secrets are kept; a presented key is hashed and compared with every
// configured digest in constant time (timingSafeEqual on equal-length digests, no early exit).
import { createHash, timingSafeEqual } from 'node:crypto';
import { ROLE_NAME } from '../../fence/admin.ts';
import { scramSecret, type ScramSecret } from './scram.ts';

export interface AccessKey {
  name: string;
  /** SHA-256 of the secret. */
  digest: Buffer;
  /** Fence keys (and object keys) this key may write start with one of these; `""` = any. */
  fenceKeyPrefixes: readonly string[];
  /** Role for POST /v1/transactions; a key without one may not run transactions. */
  pgRole: string | null;
  readOnly: boolean;
  /** SCRAM-SHA-256 keys of the secret, for the SQL endpoint's login; absent for `secretSha256` keys. */
  scram?: ScramSecret;
}

export interface AuthConfig {
  /** Empty: the proxy runs open (no authentication). */
  keys: readonly AccessKey[];
  /** Reads (`access: 'read'`): open to anyone, or any configured key. Ignored without keys. */
  readAccess: 'open' | 'key';
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;
const MIN_SECRET_CHARS = 16;
const MAX_BEARER_CHARS = 1024;
const KEY_FIELDS = new Set(['name', 'secret', 'secretSha256', 'fenceKeyPrefixes', 'pgRole', 'readOnly']);

export function digestOf(secret: string): Buffer {
  return createHash('sha256').update(secret, 'utf8').digest();
}

/**
 * Parses the keys JSON: an array of keys, or `{"keys": [...]}`. Each key: `name`, exactly one of
 * `secret` (≥ 16 characters; hashed at once) or `secretSha256` (64 hex digits), `fenceKeyPrefixes`
 * (required unless `readOnly`), optional `pgRole`, optional `readOnly`. Throws Error naming the
 * problem (the caller prefixes the variable).
 */
export function parseKeys(json: string): AccessKey[] {
  let doc: unknown;
  try {
    doc = JSON.parse(json);
  } catch (err) {
    throw new Error(`is not valid JSON (${(err as Error).message})`);
  }
  const list = Array.isArray(doc)
    ? doc
    : typeof doc === 'object' && doc !== null && Array.isArray((doc as { keys?: unknown }).keys)
      ? (doc as { keys: unknown[] }).keys
      : null;
  if (list === null) throw new Error('must be a JSON array of keys or {"keys": [...]}');
  const names = new Set<string>();
  const digests = new Set<string>();
  return list.map((raw, i) => {
    const where = `key ${i}`;
    if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new Error(`${where} must be an object`);
    const k = raw as Record<string, unknown>;
    for (const f of Object.keys(k)) if (!KEY_FIELDS.has(f)) throw new Error(`${where} has unknown field ${JSON.stringify(f)}`);
    if (typeof k.name !== 'string' || !NAME.test(k.name)) throw new Error(`${where}: name must be 1–100 of A-Z a-z 0-9 . _ -`);
    if (names.has(k.name)) throw new Error(`${where}: duplicate name ${k.name}`);
    names.add(k.name);
    let digest: Buffer;
    let scram: ScramSecret | undefined;
    if (k.secret !== undefined && k.secretSha256 === undefined) {
      if (
        typeof k.secret !== 'string' ||
        k.secret.length < MIN_SECRET_CHARS ||
        k.secret.length > MAX_BEARER_CHARS ||
        /[\s\u0000-\u001f]/.test(k.secret)
      ) {
        throw new Error(`key ${k.name}: secret must be ${MIN_SECRET_CHARS}–${MAX_BEARER_CHARS} characters without whitespace`);
      }
      digest = digestOf(k.secret);
      scram = scramSecret(k.secret);
    } else if (k.secretSha256 !== undefined && k.secret === undefined) {
      if (typeof k.secretSha256 !== 'string' || !/^[0-9a-fA-F]{64}$/.test(k.secretSha256))
        throw new Error(`key ${k.name}: secretSha256 must be 64 hex digits`);
      digest = Buffer.from(k.secretSha256, 'hex');
    } else {
      throw new Error(`key ${k.name}: give exactly one of secret, secretSha256`);
    }
    if (digests.has(digest.toString('hex'))) throw new Error(`key ${k.name}: same secret as another key`);
    digests.add(digest.toString('hex'));
    const readOnly = k.readOnly ?? false;
    if (typeof readOnly !== 'boolean') throw new Error(`key ${k.name}: readOnly must be true or false`);
    const prefixes = k.fenceKeyPrefixes ?? (readOnly ? [] : undefined);
    if (!Array.isArray(prefixes) || prefixes.some((p) => typeof p !== 'string')) {
      throw new Error(`key ${k.name}: fenceKeyPrefixes must be an array of strings ("" allows every key)`);
    }
    const pgRole = k.pgRole ?? null;
    if (pgRole !== null && (typeof pgRole !== 'string' || !ROLE_NAME.test(pgRole))) {
      throw new Error(`key ${k.name}: pgRole must be a plain Postgres identifier (letters, digits, _ and $, at most 63)`);
    }
    return Object.freeze({
      name: k.name,
      digest,
      fenceKeyPrefixes: Object.freeze([...(prefixes as string[])]),
      pgRole,
      readOnly,
      ...(scram ? { scram } : {}),
    });
  });
}

/** The key whose secret is `bearer`, or null. Compares with every key, always. */
export function findKey(keys: readonly AccessKey[], authorization: string | undefined): AccessKey | null {
  if (typeof authorization !== 'string') return null;
  const m = /^Bearer +(\S{1,1024}) *$/i.exec(authorization);
  if (!m) return null;
  const presented = digestOf(m[1]!);
  let found: AccessKey | null = null;
  for (const k of keys) if (timingSafeEqual(k.digest, presented) && found === null) found = k;
  return found;
}

/**
 * Whether a key whose fence-key prefixes are `prefixes` may write under `fenceKey` (null: open
 * mode, any fence key; []: a read-only key, none). The one prefix check of every door.
 */
export function withinPrefixes(prefixes: readonly string[] | null, fenceKey: string): boolean {
  return prefixes === null || prefixes.some((p) => fenceKey.startsWith(p));
}
