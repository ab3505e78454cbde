import { DEADLOCK_DETECTED, SERIALIZATION_FAILURE } from './sqlstate.ts';
// What an error means to the doors: retryable, unavailable, lost after send, a conflict. By
// SQLSTATE (sqlstate.ts) and node's error codes, never by Postgres's message text.

/** The statement lost a race and can run again unchanged. */
export const RETRYABLE_ERROR_CODES: ReadonlySet<string> = new Set([SERIALIZATION_FAILURE, DEADLOCK_DETECTED]);

/** The database is gone or going: the request did not commit (or we cannot know) and is safe to retry. */
export const UNAVAILABLE_ERROR_CLASSES: ReadonlySet<string> = new Set([
  '08', // connection exception
  '53', // insufficient resources (too many connections, out of memory, disk full)
  '57', // operator intervention (admin shutdown, crash shutdown, cannot connect now)
]);

/** A statement conflicts with the data: the request is well-formed but the state refuses it. */
export const CONFLICT_ERROR_CLASSES: ReadonlySet<string> = new Set([
  '23', // integrity constraint violation (unique, foreign key, check, not null, exclusion)
]);

const NODE_NET_ERRORS = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH', 'EAI_AGAIN']);

export function sqlState(err: unknown): string | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err && typeof err.code === 'string' && /^[0-9A-Z]{5}$/.test(err.code)) {
    return err.code;
  }
  return undefined;
}

export function isRetryable(err: unknown): boolean {
  const code = sqlState(err);
  return code !== undefined && RETRYABLE_ERROR_CODES.has(code);
}

/**
 * The connection was lost (or the client stopped waiting) after a statement was sent, with no
 * answer from the server: it may have committed. (An error the server reported means it did not;
 * a failure to connect means nothing was sent.)
 */
export function isLostAfterSend(err: unknown): boolean {
  if (sqlState(err) !== undefined || typeof err !== 'object' || err === null) return false;
  const e = err as { code?: unknown; message?: unknown };
  if (e.code === 'ECONNRESET' || e.code === 'EPIPE') return true;
  const msg = typeof e.message === 'string' ? e.message : '';
  return /Connection terminated unexpectedly|Query read timeout|Client has encountered a connection error/.test(msg);
}

/** True when the error means "database unreachable", not "the statement is wrong". */
export function isUnavailable(err: unknown): boolean {
  const code = sqlState(err);
  if (code !== undefined) return UNAVAILABLE_ERROR_CLASSES.has(code.slice(0, 2));
  if (typeof err !== 'object' || err === null) return false;
  const e = err as { code?: unknown; message?: unknown };
  if (typeof e.code === 'string' && NODE_NET_ERRORS.has(e.code)) return true;
  // node-postgres reports a dropped connection or pool wait without a code.
  const msg = typeof e.message === 'string' ? e.message : '';
  return /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Cannot use a pool after calling end|Query read timeout/.test(
    msg,
  );
}

/**
 * The error ends the connection: Postgres sent it as FATAL or PANIC (a terminated backend, say),
 * after which it closes the socket, or the socket is already gone.
 */
export function endsConnection(err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return false;
  const severity = (err as { severity?: unknown }).severity;
  if (severity === 'FATAL' || severity === 'PANIC') return true;
  return sqlState(err) === undefined && isUnavailable(err);
}

export function coerceError(err: unknown): Error {
  if (err instanceof Error) return err;
  return new Error(typeof err === 'string' ? err : JSON.stringify(err));
}
