// Reading the fencing headers and keys of a request, with registry errors for bad input.
import type { FastifyRequest } from 'fastify';
import { parseToken, keyProblem, type ProtectedPrefix } from '../../fence/index.ts';
import { ApiError } from '../errors.ts';
import { authorizeKeys } from './auth.ts';

/**
 * The `Fencing-Token` header as a bigint. The route's header schema (FENCED_HEADERS) has already
 * answered 428 token_required or 400 invalid_token; this throws only if a route forgot it.
 */
export function tokenHeader(req: FastifyRequest): bigint {
  const parsed = parseToken(req.headers['fencing-token']);
  if (!parsed.ok)
    throw new Error(`${req.routeOptions.url ?? req.url}: Fencing-Token not validated (FENCED_HEADERS missing from the route schema)`);
  return parsed.token;
}

export function checkKey(key: string | undefined, what: 'key' | 'fence key'): string {
  const problem = key === undefined ? 'is empty' : keyProblem(key);
  if (problem !== null || key === undefined) throw new ApiError('invalid_key', `${what} ${problem}`);
  return key;
}

/** Header values arrive as latin1 code units; keys in headers are UTF-8 bytes. */
function headerUtf8(req: FastifyRequest, name: string): string | undefined {
  const raw = req.headers[name];
  if (raw === undefined) return undefined;
  if (typeof raw !== 'string') return ''; // repeated header: treated as invalid below
  return Buffer.from(raw, 'latin1').toString('utf8');
}

/**
 * The fence key of a write to `objectKey`. Under a protected prefix (`fencepost protect --prefix`,
 * as the store last read them) it is the prefix's fence key, whatever `Fence-Key` omits; a
 * `Fence-Key` naming another is refused with 403 not_fenced (once the key is known to cover the
 * object, so a key learns nothing of prefixes outside its own). Elsewhere it is `Fence-Key`,
 * defaulting to the object key. Postgres refuses a misfenced object whatever this resolves
 * (the protected-prefix trigger): this is the friendly path.
 */
export function fenceKeyFor(req: FastifyRequest, objectKey: string): string {
  const header = headerUtf8(req, 'fence-key');
  const named = header === undefined ? undefined : checkKey(header, 'fence key');
  const protectedBy = req.server.fence.protectedPrefixes.protecting(objectKey);
  if (protectedBy === null) return named ?? objectKey;
  if (named !== undefined && named !== protectedBy.fenceKey) {
    authorizeKeys(req, [objectKey]);
    req.log.info(
      { key: objectKey, fenceKey: named, prefix: protectedBy.prefix, prefixFenceKey: protectedBy.fenceKey },
      'misfenced write to a protected prefix refused',
    );
    throw notFenced(objectKey, protectedBy, named);
  }
  return protectedBy.fenceKey;
}

/** 403 not_fenced: `objectKey` is under `protectedBy.prefix`, written only under its fence key. */
export function notFenced(objectKey: string, protectedBy: ProtectedPrefix, named: string): ApiError {
  return new ApiError(
    'not_fenced',
    `object ${JSON.stringify(objectKey)} is under the protected prefix ${JSON.stringify(protectedBy.prefix)}: it is written only under fence key ${JSON.stringify(protectedBy.fenceKey)}, not ${JSON.stringify(named)} (send that Fence-Key, or none); nothing written`,
    { prefix: protectedBy.prefix, fenceKey: protectedBy.fenceKey },
  );
}

/**
 * Before a fenced write: the key must cover the fence key and the object key (403 forbidden), and
 * a token that would raise a guarded fence must be the leader's (409 unverified_token).
 */
export async function admitWrite(req: FastifyRequest, fenceKey: string, token: bigint, objectKey?: string): Promise<void> {
  authorizeKeys(req, objectKey === undefined || objectKey === fenceKey ? [fenceKey] : [objectKey, fenceKey]);
  if (objectKey !== undefined) req.server.forgeryGuard?.admitObject(objectKey, fenceKey, token);
  await req.server.forgeryGuard?.admit(fenceKey, token);
}

const MAX_WRITER_ID_CHARS = 200;

/** `Writer-Id` header, kept for the rejection log; control characters stripped, length capped. */
export function writerId(req: FastifyRequest): string | null {
  const raw = headerUtf8(req, 'writer-id');
  if (raw === undefined || raw === '') return null;
  return raw.replace(/[\u0000-\u001f\u007f-\u009f]/g, '').slice(0, MAX_WRITER_ID_CHARS);
}
