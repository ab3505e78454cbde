// The one error registry: stable machine-readable codes and their HTTP statuses.
// test/proxy/errors.test.ts keeps this table and the error table of docs/http-api.md in sync.

export const ERRORS = {
  stale_token: {
    status: 409,
    description: 'token below the fence; body adds `fenceKey`, `token`, `highestToken` (read after the rejection)',
  },
  token_required: { status: 428, description: 'fenced request without `Fencing-Token`' },
  invalid_token: { status: 400, description: 'not digits, or out of range' },
  invalid_key: { status: 400, description: 'empty, too long, control characters, invalid UTF-8 or bad percent-encoding' },
  invalid_query: { status: 400, description: 'a query parameter is malformed (`limit` not 1…1000, …)' },
  bad_request: { status: 400, description: 'malformed HTTP request (bad Content-Length, …)' },
  payload_too_large: { status: 413, description: 'body over `FENCEPOST_BODY_LIMIT_BYTES`' },
  not_found: { status: 404, description: 'no such object, fence or route' },
  precondition_failed: {
    status: 412,
    description:
      '`If-Match` or `If-None-Match: *` of a PUT or DELETE does not hold for the object (checked in the write statement); nothing written, the fence still raised to the token',
  },
  unavailable: {
    status: 503,
    description:
      'the write failed before it could commit: database unreachable or read-only (a standby, a primary still promoting), the connection lost before COMMIT, the proxy shutting down, or the fence row locked past `FENCEPOST_LOCK_TIMEOUT_MS`; nothing committed, safe to retry',
  },
  unauthorized: { status: 401, description: 'keys are configured and `Authorization: Bearer <key>` is missing or matches no key' },
  forbidden: {
    status: 403,
    description:
      'the key may not do this: a read-only key writing, a fence or object key outside its prefixes, or a transaction without a Postgres role',
  },
  forbidden_origin: {
    status: 403,
    description:
      "the request carries an `Origin` that is neither the proxy's own nor in `FENCEPOST_ALLOWED_ORIGINS` (a page from another site)",
  },
  forbidden_host: {
    status: 403,
    description:
      'no keys configured and the `Host` is not an IP address, `localhost` or in `FENCEPOST_ALLOWED_HOSTS` (DNS rebinding defence)',
  },
  unsupported_media_type: { status: 415, description: '`POST /v1/transactions` without `Content-Type: application/json`' },
  unverified_token: {
    status: 409,
    description:
      'forgery guard: the token would raise the fence but is not the sequence of the current leader under the mapped election path; body adds `fenceKey`, `token`, `electionPath`, and `untrusted` (why) when the election path itself is not trusted',
  },
  invalid_transaction: {
    status: 400,
    description: 'transaction body is not valid UTF-8 JSON of the documented shape (duplicate fence keys, NUL in SQL, …)',
  },
  too_many_statements: { status: 400, description: 'more statements than `FENCEPOST_TX_MAX_STATEMENTS` or more than 100 fences' },
  statement_not_allowed: {
    status: 400,
    description:
      'a statement starts with transaction or session control (`BEGIN`, `COMMIT`, `SET`, `RESET`, `DO`, `COPY`, …) or calls `set_config` (refused before anything runs), or a statement ended the transaction however it was written (body adds `statement`; nothing after it was applied)',
  },
  sql_error: {
    status: 400,
    description:
      'a statement failed: syntax, undefined object, data exception, …; body adds `sqlState` and `statement` (index, or null for COMMIT); nothing applied',
  },
  not_fenced: {
    status: 403,
    description:
      "SQLSTATE FP403: a write to protected data (`fencepost protect`) by a transaction that did not pass its fence: a protected table outside the transaction's `fences`, or an object under a protected prefix sent with another `Fence-Key` (body adds `prefix` and its `fenceKey`); body adds `sqlState` and `statement` on `/v1/transactions`; nothing applied",
  },
  sql_permission_denied: { status: 403, description: "SQLSTATE 42501: the key's Postgres role may not do this; nothing applied" },
  sql_conflict: {
    status: 409,
    description:
      'constraint violation (SQLSTATE 23xxx), or serialization failure/deadlock still failing after the retries; nothing applied',
  },
  sql_timeout: {
    status: 504,
    description:
      'a statement ran past `FENCEPOST_TX_STATEMENT_TIMEOUT_MS` (SQLSTATE 57014), or the whole transaction past `FENCEPOST_TX_TIMEOUT_MS` before its COMMIT was sent (during COMMIT: `commit_unknown`); nothing applied',
  },
  result_too_large: {
    status: 400,
    description:
      "the transaction's results passed `FENCEPOST_TX_MAX_RESULT_BYTES` while streaming in; the connection was dropped; nothing applied",
  },
  durability_unsafe: {
    status: 503,
    description:
      'with `FENCEPOST_REQUIRE_SYNC_STANDBY=1`, a write (object, fence, transaction; SQL endpoint: SQLSTATE FP533) while a Postgres failover could lose a fence raise (an asynchronous standby, no synchronous standby streaming, commits waiting on the standby, …, or the check failing); body adds `reasons` and `warnings`; nothing committed, safe to retry once the database is safe again (`GET /readyz` says when)',
  },
  transactions_unavailable: {
    status: 503,
    description: "the key's client login for SQL transactions does not exist or is unsafe; the proxy log has the SQL that fixes it",
  },
  commit_unknown: {
    status: 503,
    description:
      "a write's commit was sent and not confirmed: the connection lost or the query timeout passed before its answer (a commit waiting for a stalled synchronous standby waits past any statement timeout), the transaction deadline reached during COMMIT, a fence raise's COMMIT unanswered, or Postgres committing with a WARNING that the synchronous standby may not have it; it may or may not have committed: read back (by key, ETag or version) before retrying",
  },
  request_timeout: {
    status: 408,
    description: 'the request (headers and body) did not arrive within `FENCEPOST_REQUEST_TIMEOUT_MS`; the connection is closed',
  },
  headers_too_large: { status: 431, description: 'request headers over 16 KiB; the connection is closed' },
  internal: { status: 500, description: 'a bug; the write may not have committed: read it back or retry' },
} as const satisfies Record<string, { status: number; description: string }>;

export type ErrorCode = keyof typeof ERRORS;

export class ApiError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly extra: Record<string, unknown>;

  constructor(code: ErrorCode, message: string, extra: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ApiError';
    this.code = code;
    this.status = ERRORS[code].status;
    this.extra = extra;
  }

  toJSON(): Record<string, unknown> {
    return { error: this.code, message: this.message, ...this.extra };
  }
}
