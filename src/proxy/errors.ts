// The one error registry: stable machine-readable codes and their HTTP statuses.
// test/errors.test.ts keeps this table and the README's error table in sync.

export const ERRORS = {
  stale_token: { status: 409, description: 'token below the fence; body adds `fenceKey`, `token`, `highestToken` (read after the rejection)' },
  token_required: { status: 428, description: 'fenced request without `Fencing-Token`' },
  invalid_token: { status: 400, description: 'not digits, or out of range' },
  invalid_key: { status: 400, description: 'empty, too long, control characters, invalid UTF-8 or bad percent-encoding' },
  invalid_query: { status: 400, description: 'a query parameter is malformed (`limit` not 1…1000, …)' },
  bad_request: { status: 400, description: 'malformed HTTP request (bad Content-Length, …)' },
  payload_too_large: { status: 413, description: 'body over `FENCEPOST_BODY_LIMIT_BYTES`' },
  not_found: { status: 404, description: 'no such object, fence or route' },
  unavailable: { status: 503, description: 'database unreachable or the proxy is shutting down; safe to retry' },
  internal: { status: 500, description: 'a bug: the write did not commit' },
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
