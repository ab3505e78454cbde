// Fenced SQL transactions: the fence checks and a writer's statements in one database transaction.
//
// BEGIN; SET LOCAL statement_timeout; the fenced write for every fence (kind 'fence': the same
// conditional upsert as object writes, rows locked in byte order, so two transactions cannot
// deadlock on fences); if any token is below its fence, ROLLBACK and record the rejection; else
// SET LOCAL ROLE, run the statements (extended protocol: one statement per entry), check the role
// is unchanged, COMMIT. Any error rolls everything back, fence counts included. A serialization
// failure or deadlock runs the whole transaction again, a bounded number of times.
//
// Each transaction's connection is closed afterwards (release(true)): whatever the statements did
// to their session (settings, temp tables, advisory locks, prepared statements) reaches no other
// request.
import pg from 'pg';
import * as q from './queries.ts';
import type { Isolation } from './queries.ts';
import { coerceError, isRetryable } from './pg-errors.ts';

export type { Isolation };

export interface TxFence {
  fenceKey: string;
  token: bigint;
}

export interface TxStatement {
  sql: string;
  params: unknown[];
}

export interface TxOptions {
  /** Postgres role the statements run as (SET LOCAL ROLE); null = the proxy's login role. */
  role: string | null;
  statementTimeoutMs: number;
  /** Extra attempts after a serialization failure or deadlock. */
  retries: number;
  isolation: Isolation;
  writerId: string | null;
}

export interface StatementResult {
  rowCount: number | null;
  rows: Record<string, unknown>[];
}

export type TxResult =
  | { committed: true; results: StatementResult[] }
  | { committed: false; stale: { fenceKey: string; token: bigint; highestToken: bigint }[] };

/** A statement (index; null for COMMIT) failed; `cause` is the pg error. Nothing was applied. */
export class StatementError extends Error {
  readonly index: number | null;
  constructor(index: number | null, cause: unknown) {
    super(`${index === null ? 'COMMIT' : `statement ${index}`} failed: ${coerceError(cause).message}`, { cause });
    this.name = 'StatementError';
    this.index = index;
  }
}

/** The statements left the role they were given (e.g. RESET ROLE); rolled back. */
export class RoleChangedError extends Error {
  constructor(expected: string, actual: string) {
    super(`statements changed the role from ${expected} to ${actual}; rolled back`);
    this.name = 'RoleChangedError';
  }
}

/** Postgres role names we accept in configuration (also passed as a parameter, never spliced). */
export const ROLE_NAME = /^[A-Za-z_][A-Za-z0-9_$]{0,62}$/;

// First words that would end, split or escape the transaction, or change the session or role:
// COMMIT in the middle would make the rest autocommit; SET ROLE / RESET ROLE would leave the
// writer's role; SET statement_timeout would lift the timeout; COPY FROM STDIN would hang.
const REFUSED_FIRST_WORDS = new Set([
  'begin', 'start', 'commit', 'end', 'rollback', 'abort', 'savepoint', 'release', 'prepare',
  'set', 'reset', 'do', 'copy', 'listen', 'discard',
]);

/**
 * Why a statement is refused before it is sent, or null. Looks at the first word after comments
 * and whitespace, and refuses `set_config` anywhere (it is SET in function form). A guard against
 * mistakes and the obvious escapes, not a SQL sandbox: see README "Security".
 */
export function refusedStatement(sql: string): string | null {
  if (sql.includes('\u0000')) return 'contains a NUL character';
  if (/set_config/i.test(sql)) return 'calls set_config';
  let i = 0;
  for (;;) {
    while (i < sql.length && /\s/.test(sql[i]!)) i++;
    if (sql.startsWith('--', i)) {
      const nl = sql.indexOf('\n', i);
      i = nl < 0 ? sql.length : nl + 1;
    } else if (sql.startsWith('/*', i)) {
      let depth = 1;
      i += 2;
      while (i < sql.length && depth > 0) {
        if (sql.startsWith('/*', i)) {
          depth++;
          i += 2;
        } else if (sql.startsWith('*/', i)) {
          depth--;
          i += 2;
        } else i++;
      }
    } else break;
  }
  const word = /^[A-Za-z_]+/.exec(sql.slice(i))?.[0]?.toLowerCase();
  if (word !== undefined && REFUSED_FIRST_WORDS.has(word)) return `starts with ${word.toUpperCase()}`;
  return null;
}

// Values as Postgres prints them where the JS form would lose something: bytea stays `\x…` hex
// (not a Buffer), timestamps and dates stay text (a Date loses microseconds and the zone).
const TEXT_OIDS = new Set([17, 1082, 1083, 1114, 1184, 1266]);
const resultTypes = {
  getTypeParser: (oid: number, format?: 'text' | 'binary') =>
    TEXT_OIDS.has(oid) ? (v: string) => v : pg.types.getTypeParser(oid, format ?? 'text'),
};

function toRows(r: pg.QueryArrayResult): Record<string, unknown>[] {
  const names = (r.fields ?? []).map((f) => f.name);
  // fromEntries defines own properties, so a column named __proto__ is just a key.
  return r.rows.map((row) => Object.fromEntries(names.map((n, i) => [n, row[i]])));
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Runs one fenced transaction on a connection of `pool`. Fences must have distinct keys. Throws
 * StatementError / RoleChangedError (rolled back) or a pg/network error.
 */
export async function runTransaction(pool: pg.Pool, fences: readonly TxFence[], statements: readonly TxStatement[], opts: TxOptions): Promise<TxResult> {
  const sorted = [...fences].sort((a, b) => Buffer.compare(Buffer.from(a.fenceKey), Buffer.from(b.fenceKey)));
  for (let attempt = 0; ; attempt++) {
    try {
      const outcome = await attemptTransaction(pool, sorted, statements, opts);
      if (outcome.committed) return outcome;
      await recordStale(pool, outcome.stale, opts.writerId);
      return outcome;
    } catch (err) {
      const pgErr = err instanceof StatementError ? err.cause : err;
      if (!isRetryable(pgErr) || attempt >= opts.retries) throw err;
      await sleep(Math.random() * 10 * (attempt + 1));
    }
  }
}

async function attemptTransaction(pool: pg.Pool, fences: readonly TxFence[], statements: readonly TxStatement[], opts: TxOptions): Promise<TxResult> {
  const client = await pool.connect();
  let open = false;
  try {
    await client.query(q.beginTransaction(opts.isolation));
    open = true;
    await client.query(q.setLocal('statement_timeout', String(opts.statementTimeoutMs)));
    const fenced = await client.query<{ ord: number; highest_token: string | null }>(
      q.fencedWrite(fences.map((f) => ({ kind: 'fence', fenceKey: f.fenceKey, key: null, token: f.token, contentType: null, body: null }))),
    );
    const staleOrds = fenced.rows.filter((r) => r.highest_token === null).map((r) => r.ord);
    if (staleOrds.length > 0) {
      await client.query(q.rollbackTransaction());
      open = false;
      return { committed: false, stale: staleOrds.map((i) => ({ fenceKey: fences[i]!.fenceKey, token: fences[i]!.token, highestToken: fences[i]!.token })) };
    }
    if (opts.role !== null) await client.query(q.setLocal('role', opts.role));
    const results: StatementResult[] = [];
    for (const [i, st] of statements.entries()) {
      let r: pg.QueryArrayResult;
      try {
        // Extended protocol (queryMode, missing from @types/pg): Postgres refuses several
        // statements in one entry.
        const config: pg.QueryArrayConfig = { text: st.sql, values: st.params, rowMode: 'array', types: resultTypes };
        r = await client.query(Object.assign(config, { queryMode: 'extended' as const }));
      } catch (err) {
        throw new StatementError(i, err);
      }
      results.push({ rowCount: r.rowCount ?? null, rows: toRows(r) });
    }
    if (opts.role !== null) {
      const { rows } = await client.query<{ role: string }>(q.currentRole());
      const actual = rows[0]?.role ?? '';
      if (actual !== opts.role) throw new RoleChangedError(opts.role, actual);
    }
    try {
      await client.query(q.commitTransaction());
      open = false;
    } catch (err) {
      open = false; // a failed COMMIT ends the transaction
      throw new StatementError(null, err);
    }
    return { committed: true, results };
  } finally {
    if (open) await client.query(q.rollbackTransaction()).catch(() => {});
    client.release(true);
  }
}

/** Counts the refusal on each stale fence and logs it; fills in each fence's highest token. */
async function recordStale(pool: pg.Pool, stale: { fenceKey: string; token: bigint; highestToken: bigint }[], writerId: string | null): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      const { rows } = await pool.query<{ fence_key: string; highest_token: string }>(
        q.recordRejections(stale.map((s) => ({ kind: 'transaction', fenceKey: s.fenceKey, key: null, token: s.token, writerId }))),
      );
      const highest = new Map(rows.map((r) => [r.fence_key, BigInt(r.highest_token)]));
      for (const s of stale) s.highestToken = highest.get(s.fenceKey) ?? s.token;
      return;
    } catch (err) {
      if (!isRetryable(err) || attempt >= 5) throw err;
    }
  }
}
