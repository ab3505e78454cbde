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
// Protected data (migration 0017, src/fence/protect.ts): a transaction that passed a fence is
// marked (markFenced): `fencepost.fenced`, a transaction-local setting, gets transactionMark() of
// that fence key, a hash of the capability secret, the transaction id and the key. Anyone may set
// the setting; nobody without the secret can compute a mark, and a mark is good for its own
// transaction only. A protected table's trigger (refuse_unfenced_write) checks for the mark of its
// fence key. The same step reads a temporary sequence of the session's, so PREPARE TRANSACTION fails
// in every fenced transaction ("operated on temporary objects"): a prepared transaction would hold
// its fence across restarts, and commit whenever someone says so.
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
 * recorded as raised_by. `upTo` '<' leaves alone a fence that reached the token meanwhile (it is
 * not returned: read it again). Columns fence_key, highest_token, created.
 */
export function raiseFences(rel: string, writerId: string, upTo: '<=' | '<' = '<='): string {
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
 * plpgsql: the leader's case, one fence at exactly `token`, in one statement: the share step alone
 * with its count (one pending_counts row, committed with the transaction); then, if it passed,
 * `onShared` (the caller's checks), NO_PREPARE, the mark and `onHeld`. `secretInto` receives the
 * capability secret from the same statement (when the caller has not read it yet). Anything else
 * (a raise, a new fence, a stale token) falls through to the full rule. The function declares
 * `v_mark text` (markFenced).
 */
export function leaderFastPath(o: { secret: string; fenceKey: string; token: string; secretInto?: string; onShared?: string; onHeld: string }): string {
  const returning = o.secretInto === undefined ? '' : `\n    RETURNING ${CAPABILITY_SECRET_SQL} INTO ${o.secretInto}`;
  return `INSERT INTO fencepost.pending_counts (fence_key)
    SELECT f.fence_key FROM fencepost.fences f WHERE f.fence_key = ${o.fenceKey} AND f.highest_token = ${o.token} FOR SHARE OF f${returning};
  IF FOUND THEN
    ${o.onShared ?? ''}
    ${NO_PREPARE}
    ${markFenced(o.secret, o.fenceKey, 'v_mark')}
    ${o.onHeld}
  END IF;`;
}

/** SQL: the mark of fence key `fenceKey` (a text expression) for this transaction; `secret` is the capability secret. */
export function transactionMark(secret: string, fenceKey: string): string {
  return `encode(sha256(convert_to(${secret} || '|' || txid_current()::text || '|' || ${fenceKey} || '|' || ${secret}, 'UTF8')), 'hex')`;
}

/** The setting that holds a transaction's marks (transaction-local). */
export const MARK_SETTING = 'fencepost.fenced';

/** The session's temporary sequence every fenced transaction reads (no PREPARE TRANSACTION). */
export const NO_PREPARE_SEQUENCE = 'fencepost_no_prepare_seq';

/**
 * plpgsql, in a SECURITY DEFINER function: this transaction passed the fence `fenceKey` (holding
 * it until it ends). Marks it for protected tables. (The door's entry function has ruled out
 * PREPARE TRANSACTION already: NO_PREPARE, once per transaction.) With `into`, an assignment to
 * that text variable: an expression plpgsql evaluates itself, without a statement of SPI's.
 */
export function markFenced(secret: string, fenceKey: string, into?: string): string {
  const set = `pg_catalog.set_config('${MARK_SETTING}', coalesce(pg_catalog.current_setting('${MARK_SETTING}', true), '') || ${transactionMark(secret, fenceKey)}, true)`;
  return into === undefined ? `PERFORM ${set};` : `${into} := ${set};`;
}

/**
 * plpgsql, in a SECURITY DEFINER function of a read-write transaction: reads the session's
 * temporary sequence (made once per backend), so PREPARE TRANSACTION fails in this transaction
 * ("operated on temporary objects"). Expressions only, no SQL statement: the name is looked up in
 * the session's temporary schema and read with pg_sequence_last_value, which opens nothing but a
 * sequence. A writer's own object of that name (a view or a table with a policy, whose code would
 * run as this function's owner if it were queried) fails it unread (42809), and so does a writer's
 * sequence the owner may not read (42501); a sequence runs no code of anyone's.
 */
export const NO_PREPARE = `DECLARE
      v_no_prepare regclass := pg_catalog.to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}');
    BEGIN
      IF v_no_prepare IS NULL THEN
        CREATE TEMPORARY SEQUENCE ${NO_PREPARE_SEQUENCE};
        v_no_prepare := pg_catalog.to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}');
      END IF;
      IF pg_catalog.pg_sequence_last_value(v_no_prepare) IS NOT NULL THEN
        NULL;
      END IF;
    END;`;

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
