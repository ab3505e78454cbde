// The fence injected into every transaction of a session (src/fence/definitions.ts
// fence_session_bound): two statements the proxy prepares once per backend connection under
// reserved names and runs with Bind/Execute before the writer's first statement of each transaction.
//
//   1. SET transaction_read_only = off — sessions start read-only; this must run before the
//      transaction's first snapshot (a SET takes none), so it comes first. It lasts this
//      transaction only: every transaction starts from default_transaction_read_only. Not SET
//      LOCAL: outside a transaction block (an implicit transaction up to Sync, the autocommit
//      statement of most drivers) that writes a WARNING to the server log and a notice to the
//      proxy in every transaction.
//   2. fence_session_bound(session capability, prefixes, writer, guard state): check and raise the
//      fence; when the session has no token it returns false and the same statement makes the
//      transaction read-only again.
//
// The capability travels only as a bind parameter: pg_stat_activity shows query text (ours is
// fixed) to sessions of the same role, never parameters.
import pg from 'pg';
import { boundCapability } from '../../fence/rule.ts';
import { parseStaleDetail } from '../../fence/detail.ts';
export { GUARD_UNAVAILABLE, INVALID_FENCE_SETTING, STALE_TOKEN } from '../../fence/codes.ts';
import { DURABILITY_UNSAFE } from '../../fence/codes.ts';
import { encode } from './framing.ts';

export const RW_STATEMENT = '__fencepost_rw';
export const FENCE_STATEMENT = '__fencepost_fence';
export const REFUSE_ROUTINE_STATEMENT = '__fencepost_refuse_routine';
export const REFUSE_UNSAFE_STATEMENT = '__fencepost_refuse_unsafe';
/** The statement that makes a fenced transaction read-write (the first of the two above). */
export const RW_SQL = 'SET transaction_read_only = off';
// The session capability (a hash bound to this backend, see sessionCapability), not the capability
// itself: a writer that makes this statement fail with its parameters in the error report (it may
// set log_parameter_max_length_on_error) learns nothing it could use beyond its own session.
const FENCE_SQL = "SELECT pg_catalog.set_config('transaction_read_only', 'on', true) WHERE NOT fencepost.fence_session_bound($1, $2, $3, $4)";

// Sent in place of an extended-protocol CALL or DO outside a transaction block (a procedure or DO
// block could COMMIT there and go on in a transaction nobody fenced): it fails, so the backend
// skips the writer's Execute and the rest of its pipeline up to Sync, and the group commits nothing.
const REFUSE_ROUTINE_SQL = `DO $fencepost$BEGIN RAISE EXCEPTION 'the fencepost SQL endpoint runs CALL and DO only inside a transaction block'
  USING ERRCODE = '0A000',
        DETAIL = 'A procedure or DO block run on its own may COMMIT and go on in a transaction the fence does not cover.',
        HINT = 'Send BEGIN first (or use the simple protocol, where it runs in the fenced implicit transaction).'; END$fencepost$`;

// The fence's stand-in while writes are refused (FENCEPOST_REQUIRE_SYNC_STANDBY and a failover
// could lose a fence raise; src/fence/durability-monitor.ts), in its place after the read-write SET: a
// session with a token (one that writes) fails its transaction, which applies nothing; one without
// gets a read-only transaction, as the fence gives it. Decided in the database, from the session's
// own settings as they are in this transaction. Like the fence, it touches a temporary object, so
// PREPARE TRANSACTION fails: a table of the session's role, under a name of its own (it runs as the
// session's role, so a writer's object of that name can do nothing the writer could not; the
// fence's reads a sequence, rule.ts NO_PREPARE), made once per backend.
const REFUSE_UNSAFE_SQL = `DO $fencepost$BEGIN
  IF coalesce(pg_catalog.current_setting('fencepost.token', true), '') <> '' THEN
    RAISE EXCEPTION 'writes are refused while a Postgres failover could lose a fence raise (FENCEPOST_REQUIRE_SYNC_STANDBY=1)'
      USING ERRCODE = '${DURABILITY_UNSAFE}',
            DETAIL = 'Nothing of this transaction was applied.',
            HINT = 'Retry once the database is safe again: the proxy''s GET /readyz says when, and why not now.';
  END IF;
  IF pg_catalog.to_regclass('pg_temp.fencepost_refused_no_prepare') IS NULL THEN
    -- A catalog write of a transaction that writes nothing else: its commit need not wait for a
    -- synchronous standby, which may be the very one not streaming now.
    PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    CREATE TEMPORARY TABLE fencepost_refused_no_prepare ();
  END IF;
  PERFORM FROM pg_temp.fencepost_refused_no_prepare;
  PERFORM pg_catalog.set_config('transaction_read_only', 'on', true);
END$fencepost$`;

const TEXT_OID = 25;

/** SQLSTATE a tokenless write meets: the transaction is read-only. */
export const READ_ONLY_TRANSACTION = '25006';

/** How many Close and Parse messages prepareFence() sends (one each per statement). */
export const PREPARED_STATEMENTS = 4;

/**
 * The fence for a transaction that starts in the middle of a pipeline whose statements are not
 * prepared yet (the group began in a failed transaction, where Parse is refused): Close and Parse
 * each statement right before its Bind/Execute, the read-write SET before the SELECT's snapshot.
 * `run` is the session's runFence() bytes.
 */
export function prepareAndRunFence(run: Buffer): Buffer {
  const rwRun = runRw().length;
  return Buffer.concat([
    closeStatement(RW_STATEMENT),
    RW_PARSE,
    run.subarray(0, rwRun),
    closeStatement(FENCE_STATEMENT),
    FENCE_PARSE,
    closeStatement(REFUSE_UNSAFE_STATEMENT),
    REFUSE_UNSAFE_PARSE,
    run.subarray(rwRun),
    closeStatement(REFUSE_ROUTINE_STATEMENT),
    REFUSE_ROUTINE_PARSE,
  ]);
}

/** Close (so a DISCARD ALL or DEALLOCATE cannot leave a name taken) and Parse the statements. */
export function prepareFence(): Buffer {
  return Buffer.concat([
    closeStatement(RW_STATEMENT),
    closeStatement(FENCE_STATEMENT),
    closeStatement(REFUSE_UNSAFE_STATEMENT),
    closeStatement(REFUSE_ROUTINE_STATEMENT),
    RW_PARSE,
    FENCE_PARSE,
    REFUSE_UNSAFE_PARSE,
    REFUSE_ROUTINE_PARSE,
  ]);
}

/** Bind/Execute of the refusal of a CALL or DO outside a transaction block (it always fails). */
export function runRoutineRefusal(): Buffer {
  return Buffer.concat([bindUnnamed(REFUSE_ROUTINE_STATEMENT, []), EXECUTE]);
}

/** A Query that makes the session's transactions read-only by default again (see planner.ts). */
export const RESET_READ_ONLY_SQL = 'SET default_transaction_read_only = on';

/** A text value of Postgres's array input syntax. */
export function textArrayLiteral(items: readonly string[]): string {
  return `{${items.map((s) => `"${s.replace(/["\\]/g, (c) => `\\${c}`)}"`).join(',')}}`;
}

const RW_PARSE = encode({ type: 'parse', name: RW_STATEMENT, text: RW_SQL, paramTypes: [] });
const FENCE_PARSE = encode({ type: 'parse', name: FENCE_STATEMENT, text: FENCE_SQL, paramTypes: [TEXT_OID, TEXT_OID, TEXT_OID, TEXT_OID] });
const REFUSE_UNSAFE_PARSE = encode({ type: 'parse', name: REFUSE_UNSAFE_STATEMENT, text: REFUSE_UNSAFE_SQL, paramTypes: [] });
const REFUSE_ROUTINE_PARSE = encode({ type: 'parse', name: REFUSE_ROUTINE_STATEMENT, text: REFUSE_ROUTINE_SQL, paramTypes: [] });
const EXECUTE = encode({ type: 'execute', portal: '', maxRows: 0 });

function closeStatement(name: string): Buffer {
  return encode({ type: 'close', target: 'S', name });
}

/** Bind of a statement to the unnamed portal. */
function bindUnnamed(statement: string, values: readonly (string | null)[]): Buffer {
  return encode({ type: 'bind', portal: '', statement, values });
}

/** Bind/Execute of both statements for one transaction (built once per session). */
function runRw(): Buffer {
  return Buffer.concat([bindUnnamed(RW_STATEMENT, []), EXECUTE]);
}

/** The refusal in the fence's place (REFUSE_UNSAFE_SQL): Bind/Execute bytes and Query text, of the fence's shape (two statements). */
export function refusalInPlaceOfFence(): { run: Buffer; text: string } {
  return { run: Buffer.concat([runRw(), bindUnnamed(REFUSE_UNSAFE_STATEMENT, []), EXECUTE]), text: `${RW_SQL};${REFUSE_UNSAFE_SQL};` };
}

/** `prefixes` as textArrayLiteral gives them, the form sessionCapability hashes. */
export function runFence(sessionCap: string, prefixes: string | null, writerId: string, guard: string | null): Buffer {
  return Buffer.concat([runRw(), bindUnnamed(FENCE_STATEMENT, [sessionCap, prefixes, writerId, guard]), EXECUTE]);
}

/** The fence key, token and highest token of an FP409's detail (src/fence/detail.ts). */
export const staleDetail = parseStaleDetail;

/**
 * A friendly guess, not a boundary: does this statement text start a transaction block (BEGIN,
 * START TRANSACTION)? Then the fence goes right after it, so `BEGIN ISOLATION LEVEL …` still comes
 * first. A wrong guess costs an error (25001), never an unfenced write: an unfenced transaction
 * is read-only.
 */
const BEGIN_MODE = '(?:ISOLATION\\s+LEVEL\\s+(?:SERIALIZABLE|REPEATABLE\\s+READ|READ\\s+COMMITTED|READ\\s+UNCOMMITTED)|READ\\s+WRITE|READ\\s+ONLY|(?:NOT\\s+)?DEFERRABLE)';
const DEFERRABLE_BEGIN = new RegExp(`^\\s*(?:(BEGIN)(?:\\s+(?:WORK|TRANSACTION))?|(START)\\s+TRANSACTION)(?:\\s+${BEGIN_MODE}(?:\\s*,?\\s*${BEGIN_MODE})*)?\\s*;?\\s*$`, 'i');

/**
 * A lone BEGIN or START TRANSACTION, with transaction modes at most (no comment, nothing else) —
 * one the proxy may answer itself and send later (planner.ts): its CommandComplete tag, else null.
 */
export function deferrableBegin(sql: string): string | null {
  const m = DEFERRABLE_BEGIN.exec(sql);
  if (m === null) return null;
  return m[2] !== undefined ? 'START TRANSACTION' : 'BEGIN';
}

export function startsTransactionBlock(sql: string): boolean {
  const m = /^(?:\s|--[^\n]*\n|\/\*[^]*?\*\/)*(begin|start)\b/i.exec(sql);
  return m !== null;
}

// ---- simple protocol ----------------------------------------------------------------------------
// A Query can only carry text, and a Query sent after Bind/Execute without a Sync leaves the
// backend's transaction state confused, so the fence is prepended as SQL: the read-write SET, then
// fence_session_bound() with a session capability (src/fence/definitions.ts) — a hash of the
// capability, the backend's pid, the prefixes and the writer, useless to anyone but this backend
// doing what the proxy does for it anyway. The capability itself never appears in text.

/** The session capability fence_session_bound() checks (bound to the guard state too). */
export function sessionCapability(capability: string, backendPid: number, prefixes: string | null, writerId: string, guard: string | null): string {
  return boundCapability(capability, backendPid, [prefixes, writerId, guard]);
}

/** The SQL prepended to a writer's Query (two statements, each ending in `;`). */
export function fencePrefix(sessionCap: string, prefixes: string | null, writerId: string, guard: string | null): string {
  const lit = (v: string | null) => (v === null ? 'NULL' : pg.escapeLiteral(v));
  return `${RW_SQL};SELECT pg_catalog.set_config('transaction_read_only', 'on', true) WHERE NOT fencepost.fence_session_bound(${lit(sessionCap)}, ${lit(prefixes)}, ${lit(writerId)}, ${lit(guard)});`;
}

/**
 * The forgery guard's state for fence_session_bound (session_guard_check, src/fence/definitions.ts),
 * as JSON text: the guarded fence-key prefixes, and the session's (fence key, token) the guard
 * admitted, or could not check (`unavailable`). The database refuses a raise of a guarded fence by any other pair.
 */
export function guardState(prefixes: readonly string[], checked: { fenceKey: string; token: bigint; verdict: 'verified' | 'unavailable' } | null): string {
  return JSON.stringify({
    prefixes,
    ...(checked ? { fenceKey: checked.fenceKey, token: checked.token.toString(), ...(checked.verdict === 'unavailable' ? { unavailable: true } : {}) } : {}),
  });
}

/** True when a Query holds no statement (only blanks and comments): it must keep its EmptyQueryResponse. */
export function isEmptyQuery(sql: string): boolean {
  return /^(?:\s|;|--[^\n]*(?:\n|$)|\/\*[^]*?\*\/)*$/.test(sql);
}

