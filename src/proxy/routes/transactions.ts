// POST /v1/transactions — fenced SQL: the fence checks and the writer's statements in one
// database transaction (src/fence/transaction.ts). All or nothing.
import type { FastifyInstance, FastifyPluginOptions, FastifyRequest } from 'fastify';
import type pg from 'pg';
import { parseToken } from '../../fence/token.ts';
import { RoleChangedError, StatementError, refusedStatement, runTransaction, type Isolation, type TxFence, type TxStatement } from '../../fence/transaction.ts';
import {
  CONFLICT_ERROR_CLASSES,
  INSUFFICIENT_PRIVILEGE,
  INTERNAL_ERROR_CLASSES,
  PROTOCOL_VIOLATION,
  QUERY_CANCELED,
  RETRYABLE_ERROR_CODES,
  isUnavailable,
  sqlState,
} from '../../fence/pg-errors.ts';
import { ApiError } from '../errors.ts';
import { authorizeKeys } from '../auth.ts';
import { checkKey, writerId } from '../request.ts';
import { staleToken } from './stale.ts';

export interface TransactionOptions {
  /** Pool the transactions run on (default: the store's). Each connection is closed after use. */
  pool: pg.Pool;
  maxStatements: number;
  statementTimeoutMs: number;
  /** Extra attempts after 40001/40P01. */
  retries: number;
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

/** A pg error from the transaction as a registry error, or null to let the app-wide handler map it. */
function sqlApiError(err: unknown, index: number | null): ApiError | null {
  const state = sqlState(err);
  if (state === undefined) return null;
  const extra = { sqlState: state, statement: index };
  const msg = (err as Error).message;
  const where = index === null ? 'the transaction' : `statements[${index}]`;
  if (state === QUERY_CANCELED) return new ApiError('sql_timeout', `${where} ran past the statement timeout; nothing applied`, extra, { cause: err });
  // A bind with the wrong number of parameters is a protocol violation, not a lost connection.
  if (state === PROTOCOL_VIOLATION && index !== null) return new ApiError('sql_error', `${where}: ${msg}; nothing applied`, extra, { cause: err });
  if (isUnavailable(err) || INTERNAL_ERROR_CLASSES.has(state.slice(0, 2))) return null;
  if (state === INSUFFICIENT_PRIVILEGE) return new ApiError('sql_permission_denied', `${where}: ${msg}; nothing applied`, extra, { cause: err });
  if (CONFLICT_ERROR_CLASSES.has(state.slice(0, 2)) || RETRYABLE_ERROR_CODES.has(state)) {
    return new ApiError('sql_conflict', `${where}: ${msg}; nothing applied`, extra, { cause: err });
  }
  return new ApiError('sql_error', `${where}: ${msg}; nothing applied`, extra, { cause: err });
}

function roleFor(req: FastifyRequest): string | null {
  const key = req.accessKey;
  if (key === null) return null; // open mode: the proxy's login role
  if (key.pgRole === null) throw new ApiError('forbidden', `key ${key.name} has no pgRole: it may not run SQL transactions`);
  return key.pgRole;
}

export async function transactionRoutes(app: FastifyInstance, opts: FastifyPluginOptions & Partial<TransactionOptions>): Promise<void> {
  const options: TransactionOptions = {
    pool: opts.pool ?? app.store.pool,
    maxStatements: opts.maxStatements ?? 100,
    statementTimeoutMs: opts.statementTimeoutMs ?? 5000,
    retries: opts.retries ?? 3,
  };
  app.post('/v1/transactions', { config: { access: 'write', operation: 'transaction' } }, async (req) => {
    const tx = parseBody(req.body, options.maxStatements);
    const role = roleFor(req);
    authorizeKeys(req, tx.fences.map((f) => f.fenceKey));
    for (const f of tx.fences) await app.forgeryGuard?.admit(f.fenceKey, f.token);
    let result;
    try {
      result = await runTransaction(options.pool, tx.fences, tx.statements, {
        role,
        statementTimeoutMs: options.statementTimeoutMs,
        retries: options.retries,
        isolation: tx.isolation,
        writerId: writerId(req),
      });
    } catch (err) {
      if (err instanceof RoleChangedError) throw new ApiError('forbidden', err.message, {}, { cause: err });
      const index = err instanceof StatementError ? err.index : null;
      const cause = err instanceof StatementError ? err.cause : err;
      throw sqlApiError(cause, index) ?? cause;
    }
    if (!result.committed) {
      const first = result.stale[0]!;
      throw staleToken(req, first.fenceKey, first.token, first.highestToken);
    }
    return { results: result.results };
  });
}
