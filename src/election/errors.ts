// Errors raised by the election library. ZooKeeper result codes are named here once; nothing
// matches on message text.

/** ZooKeeper result codes that the election logic branches on. */
export const ZK_CODES = Object.freeze({
  CONNECTION_LOSS: -4,
  OPERATION_TIMEOUT: -7,
  NO_NODE: -101,
  NO_AUTH: -102,
  BAD_VERSION: -103,
  NODE_EXISTS: -110,
  NOT_EMPTY: -111,
  SESSION_EXPIRED: -112,
});

/** Outcomes after which the request may or may not have been applied by the server. */
export const IN_DOUBT_CODES: ReadonlySet<number> = new Set([ZK_CODES.CONNECTION_LOSS, ZK_CODES.OPERATION_TIMEOUT]);

/** A ZooKeeper request failed with a server or connection result code. */
export class ZkError extends Error {
  readonly code: number;
  readonly op: string;
  readonly path: string;
  constructor(op: string, path: string, code: number, message: string, options?: { cause?: unknown }) {
    super(`${op} ${path}: ${message}`, options);
    this.name = 'ZkError';
    this.op = op;
    this.path = path;
    this.code = code;
  }
  /** The request may have been applied even though no reply arrived. */
  get inDoubt(): boolean {
    return IN_DOUBT_CODES.has(this.code);
  }
}

/** No reply within the request deadline; the request may or may not have been applied. */
export class ZkTimeoutError extends ZkError {
  constructor(op: string, path: string, timeoutMs: number) {
    super(op, path, ZK_CODES.OPERATION_TIMEOUT, `no reply within ${timeoutMs} ms`);
    this.name = 'ZkTimeoutError';
  }
}

/** The session is gone (expired, declared lost by the client's own clock, or closed). */
export class SessionLostError extends ZkError {
  constructor(op: string, path: string, why: string) {
    super(op, path, ZK_CODES.SESSION_EXPIRED, `session ${why}`);
    this.name = 'SessionLostError';
  }
}

/**
 * The int32 sequence counter of the election parent has wrapped (2^31 creates under one parent).
 * Electing by a wrapped number would hand out a token lower than earlier ones, so the election stops.
 */
export class SequenceOverflowError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SequenceOverflowError';
  }
}

/**
 * ZooKeeper refused to create or delete an election node (NoAuth): the election path's ACL does not
 * grant this session's identity. No retry fixes that, so the election stops.
 */
export class ElectionAccessError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ElectionAccessError';
  }
}

/** Leadership was not obtained because the caller gave up or the election closed. */
export class ElectionAbortedError extends Error {
  constructor(message = 'election aborted', options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'AbortError';
  }
}

/** Normalises anything thrown into an Error, keeping the original as `cause`. */
export function coerceError(err: unknown): Error {
  if (err instanceof Error) return err;
  return new Error(typeof err === 'string' ? err : 'non-error thrown', { cause: err });
}

/** The abort reason of a term's AbortSignal: leadership ended (or is in doubt). */
export class LeadershipRevokedError extends Error {
  readonly token: bigint | null;
  readonly reason: string;
  constructor(token: bigint | null, reason: string) {
    super(token === null ? 'not the leader' : `leadership with token ${token} revoked: ${reason}`);
    this.name = 'LeadershipRevokedError';
    this.token = token;
    this.reason = reason;
  }
}
