// The fence rule, in one place: how a write with token T takes its fence inside its own
// transaction, on every door. The object writes' statements (queries.ts fencedWrite, fencedPuts)
// and the SQL functions of transactions and the SQL endpoint (definitions.ts) are all built from
// the fragments below; nothing else takes a fence.
//
// Per fence key:
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
// The capability: the proxy's SQL functions run as the schema owner (SECURITY DEFINER) for client
// logins that may execute them, so each checks that its caller is the proxy: the raw secret of
// fencepost.fence_capability as a bind parameter, or a hash of it bound to one backend and the
// call's arguments where the call travels as SQL text (boundCapability, boundCapabilitySql).
import { createHash } from 'node:crypto';

/** SQL: the proxy's capability secret. */
export const CAPABILITY_SECRET_SQL = '(SELECT c.secret FROM fencepost.fence_capability c)';

/**
 * The share step over `rel`, a relation of (fence_key, token): its fences whose highest token is
 * `=` (exactly) or `>=` (at least) the token, FOR SHARE in byte order. Columns fence_key,
 * highest_token.
 */
export function shareFences(rel: string, cmp: '=' | '>='): string {
  return `SELECT f.fence_key, f.highest_token FROM fencepost.fences f JOIN ${rel} k ON k.fence_key = f.fence_key AND f.highest_token ${cmp} k.token
  ORDER BY f.fence_key COLLATE "C"
  FOR SHARE OF f`;
}

/**
 * The raise step over `rel`: its fences the share step did not lock (`held`) are inserted at their
 * token or raised to it, each row locked exclusively; `writerId` (an SQL expression over `k`) is
 * recorded as raised_by. Columns fence_key, highest_token, created.
 */
export function raiseFences(rel: string, writerId: string): string {
  return `INSERT INTO fencepost.fences AS f (fence_key, highest_token, raised_by)
  SELECT k.fence_key, k.token, ${writerId} FROM ${rel} k WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.fence_key = k.fence_key)
  ORDER BY k.fence_key COLLATE "C"
  ON CONFLICT (fence_key) DO UPDATE SET highest_token = EXCLUDED.highest_token, raised_by = EXCLUDED.raised_by, updated_at = now()
    WHERE f.highest_token <= EXCLUDED.highest_token
  RETURNING f.fence_key, f.highest_token, (f.xmax = 0) AS created`;
}

/**
 * The whole rule for the fences of `rel` (one token per fence key), as three CTEs: `held` (share),
 * `raised` (raise), and `fence`, the fences the statement passed with their highest token: an
 * operation passes where that equals its token; a fence missing from `fence` refused the token.
 */
export function fenceCtes(rel: string, writerId: string): string {
  return `held AS (
  ${shareFences(rel, '>=')}
),
raised AS (
  ${raiseFences(rel, writerId)}
),
fence AS (
  SELECT h.fence_key, h.highest_token FROM held h
  UNION ALL
  SELECT r.fence_key, r.highest_token FROM raised r
)`;
}

/**
 * plpgsql: the leader's case, one fence at exactly `token`: the share step alone, then its count
 * (one pending_counts row, committed with the transaction) and `onHeld`. Anything else (a raise,
 * a new fence, a stale token) falls through to the full rule.
 */
export function leaderFastPath(fenceKey: string, token: string, onHeld: string): string {
  return `PERFORM FROM fencepost.fences f WHERE f.fence_key = ${fenceKey} AND f.highest_token = ${token} FOR SHARE OF f;
  IF FOUND THEN
    INSERT INTO fencepost.pending_counts (fence_key) VALUES (${fenceKey});
    ${onHeld}
  END IF;`;
}

/** plpgsql: refuse a caller whose `presented` capability is not `expected` (an SQL expression). */
export function refuseUnlessProxy(fn: string, presented: string, expected: string): string {
  return `IF ${presented} IS DISTINCT FROM ${expected} THEN
    RAISE EXCEPTION 'fencepost.${fn} may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;`;
}

/**
 * A capability bound to one backend and the arguments of one call: sha256 of
 * `capability|pid|field|…|capability`, a null field written NULL. Useless to anyone but that
 * backend making that very call. boundCapabilitySql computes the same inside the function.
 */
export function boundCapability(capability: string, backendPid: number, fields: readonly (string | null)[]): string {
  return createHash('sha256').update([capability, String(backendPid), ...fields.map((f) => f ?? 'NULL'), capability].join('|'), 'utf8').digest('hex');
}

/** SQL: boundCapability() of the secret `secret` and the text expressions `fields`, for this backend. */
export function boundCapabilitySql(secret: string, fields: readonly string[]): string {
  const parts = [secret, 'pg_backend_pid()', ...fields.map((f) => `coalesce(${f}, 'NULL')`), secret];
  return `encode(sha256(convert_to(${parts.join(" || '|' || ")}, 'UTF8')), 'hex')`;
}
