// POST /v1/transactions — fenced SQL: the fence checks and the writer's statements in one
// database transaction (src/fence/transaction.ts). All or nothing.
import type { FastifyInstance, FastifyPluginOptions, FastifyRequest } from 'fastify';
import { parseToken } from '../../fence/token.ts';
import {
  CommitUnknownError,
  ConnectionLostError,
  FenceBusyError,
  LoginUnavailableError,
  ResultTooLargeError,
  StatementError,
  TransactionEndedError,
  TransactionRunner,
  TransactionTimeoutError,
  refusedStatement,
  type Isolation,
  type TxFence,
  type TxStatement,
} from '../../fence/transaction.ts';
import { CONFLICT_ERROR_CLASSES, INSUFFICIENT_PRIVILEGE, LOCK_NOT_AVAILABLE, QUERY_CANCELED, RETRYABLE_ERROR_CODES, sqlState } from '../../fence/pg-errors.ts';
import { ApiError } from '../errors.ts';
import { authorizeKeys, type AccessKey } from '../auth.ts';
import { checkKey, writerId } from '../request.ts';
import { staleToken } from './stale.ts';

export interface TransactionOptions {
  /** DATABASE_URL: client logins connect to the same server and database. */
  databaseUrl: string;
  /** Open-mode login, and prefix of the per-key logins (FENCEPOST_CLIENT_ROLE). */
  clientRole: string;
  /** The configured keys: each with a pgRole gets a login of its own. */
  keys: readonly AccessKey[];
  maxStatements: number;
  statementTimeoutMs: number;
  lockTimeoutMs: number;
  transactionTimeoutMs: number;
  maxResultBytes: number;
  /** Transactions running at once (FENCEPOST_TX_POOL_SIZE). */
  maxConcurrent: number;
  /** Extra attempts after 40001/40P01. */
  retries: number;
}

declare module 'fastify' {
  interface FastifyInstance {
    transactionRunner: TransactionRunner;
  }
}

export const MAX_TX_FENCES = 100;
const ISOLATIONS: readonly Isolation[] = ['read committed', 'repeatable read', 'serializable'];
const BODY_FIELDS = new Set(['fences', 'statements', 'isolation']);

interface TxRequest {
  fences: TxFence[];
  statements: TxStatement[];
  isolation: Isolation;
}

const invalid = (message: string) => new ApiError('invalid_transaction', message);

/** Deeper parameters are refused: node-postgres converts arrays recursively. */
const MAX_PARAM_DEPTH = 16;

function depthWithin(v: unknown, max: number): boolean {
  if (max < 0) return false;
  if (Array.isArray(v)) return v.every((x) => depthWithin(x, max - 1));
  if (typeof v === 'object' && v !== null) return Object.values(v).every((x) => depthWithin(x, max - 1));
  return true;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Parses and validates the body; registry errors for anything off. */
function parseBody(body: unknown, maxStatements: number): TxRequest {
  if (!Buffer.isBuffer(body) || body.length === 0) throw invalid('body must be JSON {"fences":[…],"statements":[…]}');
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
  } catch {
    throw invalid('body is not valid UTF-8');
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw invalid('body is not valid JSON');
  }
  if (!isObject(doc)) throw invalid('body must be a JSON object');
  for (const f of Object.keys(doc)) if (!BODY_FIELDS.has(f)) throw invalid(`unknown field ${JSON.stringify(f)}`);
  const { fences, statements } = doc;
  const isolation = doc.isolation ?? 'read committed';
  if (typeof isolation !== 'string' || !(ISOLATIONS as readonly string[]).includes(isolation)) throw invalid(`isolation must be one of ${ISOLATIONS.join(', ')}`);
  if (!Array.isArray(fences) || fences.length === 0) throw invalid('fences must be a non-empty array of {"key","token"}');
  if (fences.length > MAX_TX_FENCES) throw new ApiError('too_many_statements', `at most ${MAX_TX_FENCES} fences per transaction`);
  if (!Array.isArray(statements) || statements.length === 0) throw invalid('statements must be a non-empty array of {"sql","params"}');
  if (statements.length > maxStatements) throw new ApiError('too_many_statements', `at most ${maxStatements} statements per transaction (FENCEPOST_TX_MAX_STATEMENTS)`);
  const seen = new Set<string>();
  const txFences = fences.map((f, i): TxFence => {
    if (!isObject(f) || Object.keys(f).some((k) => k !== 'key' && k !== 'token')) throw invalid(`fences[${i}] must be {"key","token"}`);
    if (typeof f.key !== 'string') throw invalid(`fences[${i}].key must be a string`);
    const fenceKey = checkKey(f.key, 'fence key');
    if (seen.has(fenceKey)) throw invalid(`fence key ${JSON.stringify(fenceKey)} appears twice`);
    seen.add(fenceKey);
    const parsed = typeof f.token === 'string' ? parseToken(f.token) : ({ ok: false, reason: f.token === undefined ? 'missing' : 'invalid' } as const);
    if (!parsed.ok) {
      if (parsed.reason === 'missing') throw new ApiError('token_required', `fences[${i}] has no token`);
      throw new ApiError('invalid_token', `fences[${i}].token must be a decimal string in 0…9223372036854775807`);
    }
    return { fenceKey, token: parsed.token };
  });
  const txStatements = statements.map((s, i): TxStatement => {
    if (!isObject(s) || Object.keys(s).some((k) => k !== 'sql' && k !== 'params')) throw invalid(`statements[${i}] must be {"sql","params"}`);
    if (typeof s.sql !== 'string' || s.sql.trim() === '') throw invalid(`statements[${i}].sql must be a non-empty string`);
    if (s.sql.includes('\u0000')) throw invalid(`statements[${i}].sql contains a NUL character`);
    const params = s.params ?? [];
    if (!Array.isArray(params)) throw invalid(`statements[${i}].params must be an array`);
    if (!depthWithin(params, MAX_PARAM_DEPTH)) throw invalid(`statements[${i}].params nest deeper than ${MAX_PARAM_DEPTH}`);
    const refused = refusedStatement(s.sql);
    if (refused) throw new ApiError('statement_not_allowed', `statements[${i}] ${refused}: transaction and session control are the proxy's`);
    return { sql: s.sql, params };
  });
  return { fences: txFences, statements: txStatements, isolation: isolation as Isolation };
}

/** A statement's error (on a live connection, rolled back) as a registry error: always a 4xx or the timeout. */
function sqlApiError(err: unknown, index: number | null): ApiError {
  const state = sqlState(err) ?? 'XX000';
  const extra = { sqlState: state, statement: index };
  const msg = (err as Error).message;
  const where = index === null ? 'the transaction' : `statements[${index}]`;
  if (state === QUERY_CANCELED) return new ApiError('sql_timeout', `${where} ran past the statement timeout; nothing applied`, extra, { cause: err });
  if (state === INSUFFICIENT_PRIVILEGE) return new ApiError('sql_permission_denied', `${where}: ${msg}; nothing applied`, extra, { cause: err });
  if (CONFLICT_ERROR_CLASSES.has(state.slice(0, 2)) || RETRYABLE_ERROR_CODES.has(state) || state === LOCK_NOT_AVAILABLE) {
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
    return new ApiError('statement_not_allowed', `${err.message}: transaction control is the proxy's`, { statement: err.index }, { cause: err });
  }
  if (err instanceof ResultTooLargeError) return new ApiError('result_too_large', `${err.message} (FENCEPOST_TX_MAX_RESULT_BYTES)`, { limit: err.limit }, { cause: err });
  if (err instanceof TransactionTimeoutError) return new ApiError('sql_timeout', `${err.message} (FENCEPOST_TX_TIMEOUT_MS)`, { sqlState: null, statement: null }, { cause: err });
  if (err instanceof ConnectionLostError || err instanceof FenceBusyError) return new ApiError('unavailable', `${err.message}; safe to retry`, {}, { cause: err });
  if (err instanceof CommitUnknownError) return new ApiError('commit_unknown', `${err.message}: read back before retrying`, {}, { cause: err });
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

/** The runner of an app's transactions (buildApp creates it; the route uses it). */
export function createTransactionRunner(app: FastifyInstance, opts: Omit<TransactionOptions, 'maxStatements'>): TransactionRunner {
  return new TransactionRunner({
    owner: app.store.pool,
    databaseUrl: opts.databaseUrl,
    clientRole: opts.clientRole,
    logins: opts.keys.length === 0 ? [{ keyName: null, pgRole: null }] : opts.keys.filter((k) => k.pgRole !== null && !k.readOnly).map((k) => ({ keyName: k.name, pgRole: k.pgRole })),
    maxConcurrent: opts.maxConcurrent,
    statementTimeoutMs: opts.statementTimeoutMs,
    lockTimeoutMs: opts.lockTimeoutMs,
    transactionTimeoutMs: opts.transactionTimeoutMs,
    maxResultBytes: opts.maxResultBytes,
    retries: opts.retries,
    onProblem: (keyName, problem) =>
      app.log.warn({ keyName, login: problem.login, sql: problem.sql }, `SQL transactions refused until fixed: ${problem.message}${problem.sql.length > 0 ? ` ${problem.sql.join('; ')};` : ''}`),
  });
}

export async function transactionRoutes(app: FastifyInstance, opts: FastifyPluginOptions & { maxStatements: number }): Promise<void> {
  const runner = app.transactionRunner;
  app.post('/v1/transactions', { config: { access: 'write', operation: 'transaction' } }, async (req) => {
    const tx = parseBody(req.body, opts.maxStatements);
    const keyName = keyNameFor(req);
    authorizeKeys(req, tx.fences.map((f) => f.fenceKey));
    for (const f of tx.fences) await app.forgeryGuard?.admit(f.fenceKey, f.token);
    let result;
    try {
      result = await runner.run(keyName, tx.fences, tx.statements, { isolation: tx.isolation, writerId: writerId(req) });
    } catch (err) {
      throw runnerApiError(err);
    }
    if (!result.committed) {
      const first = result.stale[0]!;
      throw staleToken(req, first.fenceKey, first.token, first.highestToken);
    }
    return { results: result.results };
  });
}
