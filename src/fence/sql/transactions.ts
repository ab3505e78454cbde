// Fenced SQL transactions (src/fence/transaction.ts): a pooled connection is fenced once per set of
// (fence key, token) it serves (fenceSession; rule.ts connection fence); a raise above one of them
// ends the connection, so each transaction carries no proof of its own (openClientTransaction).
import type { Query } from './query.ts';
import { ROLE_NAME } from '../client-logins.ts';
import { NO_PREPARE_READ } from './rule.ts';
import { RESET_SESSION } from './session-reset.ts';

export type Isolation = 'read committed' | 'repeatable read' | 'serializable';

const BEGIN: Record<Isolation, string> = {
  'read committed': 'BEGIN ISOLATION LEVEL READ COMMITTED',
  'repeatable read': 'BEGIN ISOLATION LEVEL REPEATABLE READ',
  serializable: 'BEGIN ISOLATION LEVEL SERIALIZABLE',
};

export { RESET_SESSION };

/**
 * Fences a pooled connection for `fences` (fence key order), in a Query of its own: DISCARD
 * SEQUENCES first (what the connection was fenced for before is forgotten: a transaction of one set
 * of fences never writes with another's), then fence_session() for each, with capabilities bound to
 * this backend (rule.ts sessionFenceCapability). One row per fence, in order: its highest token
 * (null: no fence yet). The session passed each fence whose highest token is its token.
 */
export function fenceSession(fences: readonly { fenceKey: string; token: bigint; capability: string }[]): Query {
  const values: unknown[] = [];
  const calls = fences.map((f, i) => {
    values.push(f.capability, f.fenceKey, f.token.toString());
    return `SELECT ${i} AS ord, fencepost_api.fence_session($${3 * i + 1}, $${3 * i + 2}, $${3 * i + 3}::bigint)::text AS highest_token`;
  });
  return { text: calls.join(' UNION ALL '), values };
}

/**
 * Forgets every fence the connection passed (before it serves another set of fences), with the
 * settings and role an earlier transaction may have left, so fenceSession() runs as the login, and
 * opens the transaction it runs in (endFenceSession). Its last result is one row, `start`: the
 * backend's start (session_start), which the capabilities of fenceSession() are bound to.
 */
export function unfenceSession(): Query {
  return {
    text: 'RESET ALL; SET SESSION AUTHORIZATION DEFAULT; DISCARD SEQUENCES; BEGIN; SET LOCAL synchronous_commit = local; SELECT fencepost_api.session_start() AS start',
  };
}

/**
 * Ends the transaction unfenceSession() opened around fenceSession(): committed locally (a catalog
 * write of the session's, not a fence raise), so it never waits for a synchronous standby.
 */
export function endFenceSession(): Query {
  return { text: 'COMMIT' };
}

/**
 * The first round trip of a fenced transaction on a pooled client-login connection fenced for its
 * fences (fenceSession), one simple Query: reset the session (RESET_SESSION), BEGIN (read-write,
 * whatever the login's defaults say) with the statement and lock timeouts, no bind parameters in
 * error reports and the key's role, then the read of the session's temporary sequence (rule.ts
 * NO_PREPARE_READ), so the transaction cannot be prepared: a prepared transaction outlives its
 * connection, which a raise ends. The connection passed its fences when it was fenced
 * (fenceSession), and a raise above any of them ends the connection before it commits.
 *
 * Everything spliced is the proxy's own, ASCII only: the isolation from a fixed table, the
 * timeouts validated integers, the role a configured key's pgRole (a plain identifier, quoted).
 */
export function openClientTransaction(isolation: Isolation, statementTimeoutMs: number, lockTimeoutMs: number, role: string | null): Query {
  if (!Number.isSafeInteger(statementTimeoutMs) || !Number.isSafeInteger(lockTimeoutMs)) throw new Error('timeouts must be integers');
  if (role !== null && !ROLE_NAME.test(role)) throw new Error('role must be a plain identifier');
  const setRole = role === null ? '' : `; SET LOCAL ROLE "${role}"`;
  return {
    text:
      `${RESET_SESSION}${BEGIN[isolation]} READ WRITE; SET LOCAL statement_timeout = ${statementTimeoutMs}; SET LOCAL lock_timeout = ${lockTimeoutMs}; SET LOCAL log_parameter_max_length_on_error = 0${setRole}; ` +
      `SELECT ${NO_PREPARE_READ}`,
  };
}

/**
 * The last round trip, one simple Query with nothing the writer can shadow: close every cursor (a
 * WITH HOLD cursor's query would run inside COMMIT), fire every deferred trigger now, stop
 * listening and release session advisory locks (nothing of the session stays active while the
 * connection waits in the pool; the rest is reset by the next transaction), force durability on,
 * then COMMIT. A statement that ended the transaction is caught before (transaction.ts: its
 * command tag, or the block state).
 */
export function sealAndCommit(): Query {
  return {
    text: 'SET LOCAL log_parameter_max_length_on_error = 0; CLOSE ALL; SET CONSTRAINTS ALL IMMEDIATE; UNLISTEN *; SELECT pg_catalog.pg_advisory_unlock_all(); SET LOCAL synchronous_commit = on; COMMIT',
  };
}

export function terminateBackend(pid: number): Query {
  return { text: 'SELECT pg_terminate_backend($1)', values: [pid] };
}

/** ROLLBACK, and the session advisory locks a statement took (not transactional) released. */
export function rollbackTransaction(): Query {
  return { text: 'ROLLBACK; SELECT pg_catalog.pg_advisory_unlock_all()' };
}

/**
 * Prepared transactions that are the single locker of a fence row (its xmax), for a raise that hit
 * the lock timeout (prepared-holders.ts).
 */
export function preparedFenceHolders(fenceKeys: readonly string[]): Query {
  return {
    text: `SELECT f.fence_key, p.gid, f.xmax::text AS xmax, (p.gid IS NOT NULL) AS direct
FROM fencepost.fences f LEFT JOIN pg_catalog.pg_prepared_xacts p ON p.transaction = f.xmax
WHERE f.fence_key = ANY($1::text[]) AND f.xmax <> '0'::xid
ORDER BY f.fence_key COLLATE "C", p.prepared`,
    values: [fenceKeys],
  };
}

/**
 * Prepared transactions among the lockers of a MultiXactId (a row share-locked by several
 * transactions). Fails when `xmax` is no MultiXactId (the caller asks only after the single-locker
 * check found none, and treats a failure as "none").
 */
export function preparedMultiXactHolders(xmax: string): Query {
  return {
    text: `SELECT p.gid FROM pg_catalog.pg_get_multixact_members($1::text::xid) m
JOIN pg_catalog.pg_prepared_xacts p ON p.transaction = m.xid ORDER BY p.prepared`,
    values: [xmax],
  };
}
