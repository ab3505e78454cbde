// POST /v1/transactions — fenced SQL: the fence checks and the writer's statements in one
// database transaction (src/fence/transaction.ts). All or nothing.
import type pg from 'pg';
import type { FastifyInstance, FastifyPluginOptions, FastifyRequest, FastifySchemaValidationError } from 'fastify';
import {
  type Isolation,
  type TransactionSettings,
  type TxFence,
  type TxStatement,
  CommitUnknownError,
  ConnectionLostError,
  FenceBusyError,
  LoginUnavailableError,
  ResultTooLargeError,
  StatementError,
  TransactionEndedError,
  TransactionTimeoutError,
  refusedStatement,
  NOT_FENCED,
  CONFLICT_ERROR_CLASSES,
  RETRYABLE_ERROR_CODES,
  sqlState,
  SQLSTATE,
} from '../../../fence/index.ts';
import { ApiError } from '../../errors.ts';
import { authorizeKeys, type AccessKey } from '../auth.ts';
import { writerId } from '../request.ts';
import { KEY, NO_QUERY, TOKEN, registryError, type RequestPart } from '../validation.ts';
import { staleToken } from './stale.ts';

export interface TransactionOptions {
  /** DATABASE_URL (or the owner pool's settings): client logins connect to the same server and database. */
  database: string | pg.ClientConfig;
  /** Open-mode login, and prefix of the per-key logins (FENCEPOST_CLIENT_ROLE): for the app's own shared parts only. */
  clientRole: string;
  /** The configured keys: each with a pgRole gets a login of its own. */
  keys: readonly AccessKey[];
  maxStatements: number;
  statementTimeoutMs: number;
  lockTimeoutMs: number;
  /** How long a raise waits for older tokens' transactions, then ends them (FENCEPOST_RAISE_WAIT_MS); the app's own shared parts only. */
  raiseWaitMs: number;
  transactionTimeoutMs: number;
  maxResultBytes: number;
  /** Transactions running at once (FENCEPOST_TX_POOL_SIZE). */
  maxConcurrent: number;
  /** Of those, the most one key may run (FENCEPOST_TX_MAX_PER_KEY); default: all. */
  maxConcurrentPerKey?: number;
  /** Extra attempts after 40001/40P01. */
  retries: number;
  /** A key whose login could not be provisioned is checked again after this: for the app's own shared parts only. */
  provisionRetryMs: number;
}

export const MAX_TX_FENCES = 100;
const ISOLATIONS: readonly Isolation[] = ['read committed', 'repeatable read', 'serializable'];
/** Bind parameters per statement: the protocol counts them in 16 bits. */
const MAX_PARAMS = 65535;

/** The body as the schema admits it. */
interface TxBody {
  fences: { key: string; token: string }[];
  statements: { sql: string; params?: unknown[] | null }[];
  isolation?: Isolation | null;
}

/**
 * POST /v1/transactions: `{"fences":[{"key","token"}…], "statements":[{"sql","params"}…], "isolation"}`.
 * Properties in the order they are checked: isolation, then fences, then statements. SQL is
 * non-blank and has no NUL (Postgres cannot take one); the pattern runs in linear time.
 */
function transactionSchema(maxStatements: number) {
  return {
    type: 'object',
    required: ['fences', 'statements'],
    additionalProperties: false,
    description: 'a JSON object {"fences":[…],"statements":[…]}',
    properties: {
      isolation: {
        type: 'string',
        nullable: true,
        enum: [...ISOLATIONS, null],
        description: `one of ${ISOLATIONS.join(', ')} (default read committed)`,
      },
      fences: {
        type: 'array',
        minItems: 1,
        maxItems: MAX_TX_FENCES,
        description: `an array of 1 to ${MAX_TX_FENCES} {"key","token"}`,
        items: {
          type: 'object',
          required: ['key', 'token'],
          additionalProperties: false,
          description: '{"key","token"}',
          properties: { key: KEY, token: TOKEN },
        },
      },
      statements: {
        type: 'array',
        minItems: 1,
        maxItems: maxStatements,
        description: `an array of 1 to ${maxStatements} {"sql","params"}`,
        items: {
          type: 'object',
          required: ['sql'],
          additionalProperties: false,
          description: '{"sql","params"}',
          properties: {
            sql: { type: 'string', pattern: '^\\s*[^\\s\\u0000][^\\u0000]*$', description: 'non-blank SQL without NUL characters' },
            params: { type: 'array', nullable: true, maxItems: MAX_PARAMS, description: `an array of at most ${MAX_PARAMS} JSON values` },
          },
        },
      },
    },
  } as const;
}

/** Schema failures: too many fences or statements are too_many_statements, the rest invalid_transaction. */
function transactionSchemaError(errors: FastifySchemaValidationError[], part: RequestPart): Error {
  const e = errors[0];
  if (part === 'body' && e?.keyword === 'maxItems' && e.instancePath === '/fences')
    return new ApiError('too_many_statements', `at most ${MAX_TX_FENCES} fences per transaction`);
  if (part === 'body' && e?.keyword === 'maxItems' && e.instancePath === '/statements') {
    return new ApiError(
      'too_many_statements',
      `at most ${String(e.params.limit)} statements per transaction (FENCEPOST_TX_MAX_STATEMENTS)`,
    );
  }
  return registryError(errors, part, part === 'body' ? 'invalid_transaction' : 'bad_request');
}

const invalid = (message: string) => new ApiError('invalid_transaction', message);

/**
 * The JSON parser of this route only (the rest of the app reads bodies as raw bytes): strict UTF-8
 * (invalid bytes are refused, never replaced by U+FFFD) and plain JSON.parse.
 */
function parseJsonBody(_req: FastifyRequest, body: Buffer, done: (err: Error | null, body?: unknown) => void): void {
  if (body.length === 0) return done(invalid('body must be JSON {"fences":[…],"statements":[…]}'));
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
  } catch {
    return done(invalid('body is not valid UTF-8'));
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return done(invalid('body is not valid JSON'));
  }
  done(null, doc);
}

/** Deeper parameters are refused: node-postgres converts arrays recursively. */
const MAX_PARAM_DEPTH = 16;

function depthWithin(v: unknown, max: number): boolean {
  if (max < 0) return false;
  if (Array.isArray(v)) return v.every((x) => depthWithin(x, max - 1));
  if (typeof v === 'object' && v !== null) return Object.values(v).every((x) => depthWithin(x, max - 1));
  return true;
}

interface TxRequest {
  fences: TxFence[];
  statements: TxStatement[];
  isolation: Isolation;
}

/** What the schema cannot say: fence keys are distinct, parameters nest at most 16 deep, no session control. */
function toTransaction(body: TxBody): TxRequest {
  const seen = new Set<string>();
  const fences = body.fences.map((f): TxFence => {
    if (seen.has(f.key)) throw invalid(`fence key ${JSON.stringify(f.key)} appears twice`);
    seen.add(f.key);
    return { fenceKey: f.key, token: BigInt(f.token) };
  });
  const statements = body.statements.map((s, i): TxStatement => {
    const params = s.params ?? [];
    if (!depthWithin(params, MAX_PARAM_DEPTH)) throw invalid(`statements[${i}].params nest deeper than ${MAX_PARAM_DEPTH}`);
    const refused = refusedStatement(s.sql);
    if (refused)
      throw new ApiError('statement_not_allowed', `statements[${i}] ${refused}: transaction and session control are the proxy's`);
    return { sql: s.sql, params };
  });
  return { fences, statements, isolation: body.isolation ?? 'read committed' };
}

/** A statement's error (on a live connection, rolled back) as a registry error: always a 4xx or the timeout. */
function sqlApiError(err: unknown, index: number | null): ApiError {
  const state = sqlState(err) ?? SQLSTATE.INTERNAL_ERROR;
  const extra = { sqlState: state, statement: index };
  const msg = (err as Error).message;
  const where = index === null ? 'the transaction' : `statements[${index}]`;
  if (state === SQLSTATE.QUERY_CANCELED)
    return new ApiError('sql_timeout', `${where} ran past the statement timeout; nothing applied`, extra, { cause: err });
  if (state === NOT_FENCED) return new ApiError('not_fenced', `${where}: ${msg}; nothing applied`, extra, { cause: err });
  if (state === SQLSTATE.INSUFFICIENT_PRIVILEGE)
    return new ApiError('sql_permission_denied', `${where}: ${msg}; nothing applied`, extra, { cause: err });
  if (CONFLICT_ERROR_CLASSES.has(state.slice(0, 2)) || RETRYABLE_ERROR_CODES.has(state) || state === SQLSTATE.LOCK_NOT_AVAILABLE) {
    return new ApiError('sql_conflict', `${where}: ${msg}; nothing applied`, extra, { cause: err });
  }
  // Whatever else a statement raised (XX000, 08006, 57P01 from a RAISE …) is the statement's error:
  // the connection answered, so the database did not fail.
  return new ApiError('sql_error', `${where}: ${msg}; nothing applied`, extra, { cause: err });
}

/** The runner's typed failures as registry errors; anything else goes to the app-wide handler. */
function runnerApiError(err: unknown): unknown {
  if (err instanceof StatementError) return sqlApiError(err.cause, err.index);
  if (err instanceof TransactionEndedError) {
    return new ApiError(
      'statement_not_allowed',
      `${err.message}: transaction control is the proxy's`,
      { statement: err.index },
      { cause: err },
    );
  }
  if (err instanceof ResultTooLargeError)
    return new ApiError('result_too_large', `${err.message} (FENCEPOST_TX_MAX_RESULT_BYTES)`, { limit: err.limit }, { cause: err });
  if (err instanceof TransactionTimeoutError)
    return new ApiError('sql_timeout', `${err.message} (FENCEPOST_TX_TIMEOUT_MS)`, { sqlState: null, statement: null }, { cause: err });
  if (err instanceof FenceBusyError && err.heldBy) {
    return new ApiError(
      'unavailable',
      err.message,
      { fenceKey: err.heldBy.fenceKey, preparedTransaction: err.heldBy.preparedTransaction },
      { cause: err },
    );
  }
  if (err instanceof ConnectionLostError || err instanceof FenceBusyError)
    return new ApiError('unavailable', `${err.message}; safe to retry`, {}, { cause: err });
  if (err instanceof CommitUnknownError)
    return new ApiError('commit_unknown', `${err.message}: read back before retrying`, {}, { cause: err });
  if (err instanceof LoginUnavailableError) {
    return new ApiError('transactions_unavailable', `SQL transactions are not available for this key: ${err.message}`, {}, { cause: err });
  }
  return err;
}

function keyNameFor(req: FastifyRequest): string | null {
  const key = req.accessKey;
  if (key === null) return null; // open mode: the fencepost_client login
  if (key.pgRole === null) throw new ApiError('forbidden', `key ${key.name} has no pgRole: it may not run SQL transactions`);
  return key.name;
}

/** The fence's transaction settings from the route's options (TX_DEFAULTS, FENCEPOST_TX_*). */
export function transactionSettings(opts: Omit<TransactionOptions, 'maxStatements'>): TransactionSettings {
  return {
    database: opts.database,
    maxConcurrent: opts.maxConcurrent,
    maxConcurrentPerKey: opts.maxConcurrentPerKey ?? opts.maxConcurrent,
    statementTimeoutMs: opts.statementTimeoutMs,
    lockTimeoutMs: opts.lockTimeoutMs,
    transactionTimeoutMs: opts.transactionTimeoutMs,
    maxResultBytes: opts.maxResultBytes,
    retries: opts.retries,
  };
}

export async function transactionRoutes(app: FastifyInstance, opts: FastifyPluginOptions & { maxStatements: number }): Promise<void> {
  // This plugin's context holds this route only. The browser guard has refused every Content-Type
  // but application/json before the body is read, so one parser for all types: fastify's own
  // reading of the media type can never disagree with the guard's.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (req, body, done) => parseJsonBody(req, body as Buffer, done));
  const schema = {
    summary: 'Fenced SQL: the fence checks and your statements in one database transaction, all or nothing',
    body: transactionSchema(opts.maxStatements),
    querystring: NO_QUERY,
  };
  app.post<{ Body: TxBody }>(
    '/v1/transactions',
    { config: { access: 'write', operation: 'transaction' }, schema, schemaErrorFormatter: transactionSchemaError },
    async (req) => {
      const tx = toTransaction(req.body);
      const keyName = keyNameFor(req);
      authorizeKeys(
        req,
        tx.fences.map((f) => f.fenceKey),
      );
      for (const f of tx.fences) await app.forgeryGuard?.admit(f.fenceKey, f.token);
      let result;
      try {
        result = await app.fence.transact(keyName, tx.fences, tx.statements, { isolation: tx.isolation, writerId: writerId(req) });
      } catch (err) {
        throw runnerApiError(err);
      }
      if (!result.committed) {
        const first = result.stale[0]!;
        throw staleToken(req, first.fenceKey, first.token, first.highestToken);
      }
      return { results: result.results };
    },
  );
}
