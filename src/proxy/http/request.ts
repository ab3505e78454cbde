// Reading the fencing headers and keys of a request, with registry errors for bad input.
import type { FastifyRequest } from 'fastify';
import { parseToken } from '../../fence/token.ts';
import { keyProblem } from '../../fence/key.ts';
import { ApiError } from '../errors.ts';
import { authorizeKeys } from './auth.ts';

/**
 * The `Fencing-Token` header as a bigint. The route's header schema (FENCED_HEADERS) has already
 * answered 428 token_required or 400 invalid_token; this throws only if a route forgot it.
 */
export function tokenHeader(req: FastifyRequest): bigint {
  const parsed = parseToken(req.headers['fencing-token']);
  if (!parsed.ok) throw new Error(`${req.routeOptions.url ?? req.url}: Fencing-Token not validated (FENCED_HEADERS missing from the route schema)`);
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

/** `Fence-Key` header, defaulting to the object key. */
export function fenceKeyFor(req: FastifyRequest, objectKey: string): string {
  const header = headerUtf8(req, 'fence-key');
  return header === undefined ? objectKey : checkKey(header, 'fence key');
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
