// The fence rule, in one place. Two forms, both built from the fragments below:
//
// The object writes (HTTP door; sql/objects.ts fencedWrite, fencedPuts) take the fence per statement:
// - share: a fence whose highest token is T (the leader's own) is locked FOR SHARE. A leader's
//   concurrent writes share the row and never wait for one another. The lock waits for a raise in
//   flight and re-reads the row's committed version (READ COMMITTED re-checks it), so a raise that
//   commits first makes T stale. A fence above T is locked the same way and refuses T: stale.
// - raise: a fence absent or below T is inserted or raised to T by a conditional upsert, which locks
//   the row exclusively and re-checks its latest version: the raise waits for every writer holding
//   the row in share mode (the old token's writes in flight), and once it has committed no
//   statement can take the old token again.
// - order: rows are locked in byte order of their fence keys (COLLATE "C"), shared before
//   exclusive, so statements over several fences never deadlock on them.
// A fence row is never lowered or deleted (triggers of migration 0003 refuse it, whoever asks).
//
// The SQL doors (the SQL endpoint, POST /v1/transactions) fence the connection, not the
// transaction (migration 0020, definitions.ts). fence_session(), called by the proxy on the
// writer's own backend with a capability bound to the backend and its arguments
// (sessionFenceCapability), checks the token against the fence and records the backend in
// fencepost.fenced_backends, identified by a serial no other backend can take. Every raise of a
// fence, on any path (the trigger fences_revoke_older), waits a bounded time for the transactions
// the older-token backends of that key had open, terminates those backends, and commits only once
// they are gone: a connection fenced at an older token never outlives a raise. Nothing is sent
// into a writer's transactions; nothing of a raise is DDL, so no role can pin it.
//
// Protected data (migration 0017, src/fence/protect.ts): a protected table's trigger
// (refuse_unfenced_write) refuses a statement unless this backend is fenced for its fence key, and
// reads a temporary sequence of the session's (NO_PREPARE_READ) so PREPARE TRANSACTION fails.
//
// The capability: the proxy's SQL functions run as the schema owner (SECURITY DEFINER) for client
// logins that may execute them, so each checks that its caller is the proxy: a hash of the
// capability secret bound to one backend and the call's arguments, a domain tag first
// (boundCapability, boundCapabilitySql).
import { createHash } from 'node:crypto';

/** SQL: the proxy's capability secret. */
export const CAPABILITY_SECRET_SQL = '(SELECT c.secret FROM fencepost.fence_capability c)';

/**
 * The share step over `rel`, a relation of (fence_key, token): its fences whose highest token is
 * `=` (exactly) or `>=` (at least) the token, FOR SHARE in byte order. Columns fence_key,
 * highest_token.
 */
export function shareStep(rel: string, cmp: '=' | '>='): string {
  return `SELECT f.fence_key, f.highest_token FROM fencepost.fences f JOIN ${rel} k ON k.fence_key = f.fence_key AND f.highest_token ${cmp} k.token
  ORDER BY f.fence_key COLLATE "C"
  FOR SHARE OF f`;
}

/**
 * The raise step over `rel`: its fences the share step did not lock (`held`) are inserted at their
 * token or raised to it, each row locked exclusively; `writerId` (an SQL expression over `k`) is
 * recorded as raised_by. `upTo` '<' leaves alone a fence that reached the token meanwhile (it is
 * not returned: read it again). Columns fence_key, highest_token, created.
 */
export function raiseStep(rel: string, writerId: string, upTo: '<=' | '<' = '<='): string {
  return `INSERT INTO fencepost.fences AS f (fence_key, highest_token, raised_by)
  SELECT k.fence_key, k.token, ${writerId} FROM ${rel} k WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.fence_key = k.fence_key)
  ORDER BY k.fence_key COLLATE "C"
  ON CONFLICT (fence_key) DO UPDATE SET highest_token = EXCLUDED.highest_token, raised_by = EXCLUDED.raised_by, updated_at = now()
    WHERE f.highest_token ${upTo} EXCLUDED.highest_token
  RETURNING f.fence_key, f.highest_token, (f.xmax = 0) AS created`;
}

/**
 * The whole rule for the fences of `rel` (one token per fence key), as three CTEs: `held` (share),
 * `raised` (raise), and `fence`, the fences the statement passed with their highest token: an
 * operation passes where that equals its token; a fence missing from `fence` refused the token.
 */
export function fenceCtes(rel: string, writerId: string): string {
  return `held AS (
  ${shareStep(rel, '>=')}
),
raised AS (
  ${raiseStep(rel, writerId)}
),
fence AS (
  SELECT h.fence_key, h.highest_token FROM held h
  UNION ALL
  SELECT r.fence_key, r.highest_token FROM raised r
)`;
}

/** The session's temporary sequence every fenced write reads (no PREPARE TRANSACTION). */
export const NO_PREPARE_SEQUENCE = 'fencepost_no_prepare_seq';

/**
 * SQL: reads the session's temporary sequence (made by session_start for /v1/transactions, by a
 * protected table's trigger at the session's first protected write), so PREPARE TRANSACTION
 * fails in this transaction ("operated on temporary objects"): a prepared transaction outlives its
 * backend, so a raise could not end it, and would commit whenever someone says so.
 */
export const NO_PREPARE_READ = `pg_catalog.pg_sequence_last_value('pg_temp.${NO_PREPARE_SEQUENCE}'::pg_catalog.regclass)`;

/**
 * SQL: this backend's start, as text that no session setting changes (UTC, to the microsecond). With
 * the pid it names one backend for good: a reconnect that gets the same pid
 * gets another start.
 */
export const BACKEND_START_SQL =
  "(SELECT pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS') FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a)";

/** SQL: this backend's start (timestamptz): with the pid, which backend a raise may terminate. */
export const BACKEND_START_TIMESTAMP_SQL = '(SELECT a.backend_start FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a)';

/**
 * One backend, as a capability is bound to it: its pid and its start (BACKEND_START_SQL; the SQL
 * endpoint reads it, /v1/transactions calls fencepost_api.session_start()).
 */
export interface BackendIdentity {
  pid: number;
  start: string;
}

/**
 * The capability a session presents to fence_session(): bound to its backend, the fence key and the
 * token (null: no fence, only the session's setup).
 */
export function sessionFenceCapability(
  capability: string,
  backend: BackendIdentity,
  fenceKey: string | null,
  token: bigint | null,
): string {
  return boundCapability(capability, backend, ['fence_session', fenceKey, token === null ? null : token.toString()]);
}

/** plpgsql: refuse a caller whose `presented` capability is not `expected` (an SQL expression). */
export function refuseUnlessProxy(fn: string, presented: string, expected: string): string {
  return `IF ${presented} IS DISTINCT FROM ${expected} THEN
    RAISE EXCEPTION 'fencepost.${fn} may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;`;
}

/** The domain of every bound capability: a hash made for anything else never matches one. */
const CAPABILITY_DOMAIN = 'fencepost bound capability v2';

/**
 * A capability bound to one backend and the arguments of one call: sha256 of
 * `domain|capability|pid|start|field|…|capability`, a null field written NULL. Useless to anyone
 * but that backend making that very call. boundCapabilitySql computes the same inside the function.
 */
export function boundCapability(capability: string, backend: BackendIdentity, fields: readonly (string | null)[]): string {
  return createHash('sha256')
    .update(
      [CAPABILITY_DOMAIN, capability, String(backend.pid), backend.start, ...fields.map((f) => f ?? 'NULL'), capability].join('|'),
      'utf8',
    )
    .digest('hex');
}

/** SQL: boundCapability() of the secret `secret` and the text expressions `fields`, for this backend. */
export function boundCapabilitySql(secret: string, fields: readonly string[]): string {
  const parts = [
    `'${CAPABILITY_DOMAIN}'`,
    secret,
    'pg_backend_pid()',
    BACKEND_START_SQL,
    ...fields.map((f) => `coalesce(${f}, 'NULL')`),
    secret,
  ];
  return `encode(sha256(convert_to(${parts.join(" || '|' || ")}, 'UTF8')), 'hex')`;
}
