// The fence each transaction of a session carries (planner.ts sends it before the writer's first
// statement): one statement of the proxy's (two while writes are refused), run with
// Parse/Bind/Execute on the unnamed statement and portal, as a Query of its own ahead of a Query in
// a block, or written as text in front of a Query outside one (planner.ts).
// Nothing of it stays in pg_prepared_statements: the unnamed statement is not listed there, and
// the planner parses it again only when something replaced it (the writer's own unnamed Parse, a
// Query). The session itself was fenced by fencer.ts (fence_session, rule.ts); the transaction only
// proves it, with C functions:
//
//   proven    the proof (proofSql: fencepost_api.prove_epoch, the epoch proof, rule.ts epochProof,
//             and the no-PREPARE read; as Query text the procedure fencepost_api.prove, proofText);
//             FP409 once a raise replaced the epoch, and it holds the epoch until the transaction
//             ends otherwise. The transaction's mode is the writer's: the fencer made
//             the session read-write by default when it fenced it, so BEGIN READ ONLY, SET SESSION
//             CHARACTERISTICS and default_transaction_read_only behave as straight to Postgres.
//   read-only transaction_read_only = on, and the no-PREPARE read: a session without a token.
//   refused   transaction_read_only = on, and fencepost_api.refuse_transaction() with the fencer's
//             verdict (a stale or unverified token, a fence that could not be raised, malformed
//             settings): the transaction fails before the writer's first statement.
//
// Turning a transaction read-only is allowed after its first snapshot (only read-write must come
// before one), so set_config() in the SELECT does it. Not SET LOCAL: outside a transaction block
// (an implicit transaction up to Sync, the autocommit statement of most drivers) that writes a
// WARNING to the server log and a notice to the proxy in every transaction.
import pg from 'pg';
import { parseStaleDetail, DURABILITY_UNSAFE, FEATURE_NOT_SUPPORTED, NO_PREPARE_READ, NO_PREPARE_SEQUENCE } from '../../fence/index.ts';
import { encode } from './wire/frontend.ts';
import type { ErrorFields } from './wire/backend.ts';

/** The statement that makes a transaction read-write (the first of the two while writes are refused). */
export const RW_SQL = 'SET transaction_read_only = off';
const READ_ONLY_PREFIX = `SELECT pg_catalog.set_config('transaction_read_only', 'on', false), `;
/**
 * The proof: fencepost_api.prove_epoch (definitions.ts), which checks currval() of the epoch the
 * session was fenced in (its oid), or fails with FP409 and the highest token once a raise replaced it.
 */
function proofSql(epoch: string, fenceKey: string, token: string): string {
  return `SELECT fencepost_api.prove_epoch(${epoch}::pg_catalog.oid, ${fenceKey}, ${token}::pg_catalog.int8)`;
}
const PROOF_SQL = proofSql('$1', '$2', '$3');
/**
 * The proof as text in a Query (in front of the writer's text, or a Query of its own in a block):
 * the procedure fencepost_api.prove, the same check. A CALL is neither planned nor answered with a
 * row: about half the Postgres CPU of the SELECT when parsed with every Query (docs/performance.md).
 * Bound with the extended protocol the SELECT costs the same, and a CALL there could run outside a
 * block, where a procedure is not atomic: there it stays the SELECT. The values are literals of
 * unknown type, which the procedure's one signature types.
 */
function proofText(epoch: string, fenceKey: string, token: string): string {
  return `CALL fencepost_api.prove(${epoch}, ${fenceKey}, ${token})`;
}
const READ_ONLY_SQL = `${READ_ONLY_PREFIX}${NO_PREPARE_READ}`;
const REFUSE_SQL = `${READ_ONLY_PREFIX}fencepost_api.refuse_transaction($1, $2, $3, $4)`;

// Sent in front of an extended-protocol CALL or DO outside a transaction block (a procedure or DO
// block could COMMIT there and go on in a transaction nobody fenced): it fails, so the backend
// skips the writer's Execute and the rest of its pipeline up to Sync, and the group commits nothing.
const REFUSE_ROUTINE_SQL = `DO $fencepost$BEGIN RAISE EXCEPTION 'the fencepost SQL endpoint runs CALL and DO only inside a transaction block'
  USING ERRCODE = '${FEATURE_NOT_SUPPORTED}',
        DETAIL = 'A procedure or DO block run on its own may COMMIT and go on in a transaction the fence does not cover.',
        HINT = 'Send BEGIN first (or use the simple protocol, where it runs in the fenced implicit transaction).'; END$fencepost$`;

// The fence's stand-in while writes are refused (FENCEPOST_REQUIRE_SYNC_STANDBY and a failover
// could lose a fence raise; src/fence/durability-monitor.ts), in its place after the read-write SET: a
// session with a token (one that writes) fails its transaction, which applies nothing; one without
// gets a read-only transaction. Decided in the database, from the session's own settings as they
// are in this transaction. Like the fence, it reads the session's temporary sequence (rule.ts
// NO_PREPARE_READ, made by session_start() if this session has none yet), so PREPARE TRANSACTION
// fails.
const REFUSE_UNSAFE_SQL = `DO $fencepost$BEGIN
  IF coalesce(pg_catalog.current_setting('fencepost.token', true), '') OPERATOR(pg_catalog.<>) '' THEN
    RAISE EXCEPTION 'writes are refused while a Postgres failover could lose a fence raise (FENCEPOST_REQUIRE_SYNC_STANDBY=1)'
      USING ERRCODE = '${DURABILITY_UNSAFE}',
            DETAIL = 'Nothing of this transaction was applied.',
            HINT = 'Retry once the database is safe again: the proxy''s GET /readyz says when, and why not now.';
  END IF;
  IF pg_catalog.to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}') IS NULL THEN
    -- A catalog write of a transaction that writes nothing else: its commit need not wait for a
    -- synchronous standby, which may be the very one not streaming now.
    PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    PERFORM fencepost_api.session_start();
  END IF;
  PERFORM ${NO_PREPARE_READ};
  PERFORM pg_catalog.set_config('transaction_read_only', 'on', true);
END$fencepost$`;

const TEXT_OID = 25;

/** One statement of the proxy's: its SQL with text parameters, their values, and the same as literal SQL for a Query. */
export interface FenceStatement {
  sql: string;
  values: readonly (string | null)[];
  text: string;
  /** Bind of the unnamed statement (once it holds `sql`) to these values, then Execute: made once, sent with every transaction. */
  bound: Buffer;
}

/** A transaction's fence, as this session sends it. */
export interface FenceStatements {
  /** In order; the last one's error is the fence's verdict. */
  list: readonly FenceStatement[];
  /** The same as SQL text (each statement ending in `;`) for a Query. */
  text: string;
}

/**
 * The name of the proxy's statement when the writer's unnamed statement must outlive the fence
 * (the writer parsed it in an earlier group and may bind it again): closed before it is parsed,
 * and after the writer's Sync (planner.ts), so the writer never finds it.
 */
export const OWN_STATEMENT = '__fencepost_fence';
/** The refusal of a CALL or DO outside a transaction block: named, for the same reason. */
export const ROUTINE_STATEMENT = '__fencepost_refuse_routine';

const EXECUTE = encode({ type: 'execute', portal: '', maxRows: 0 });

export function closeStatement(name: string): Buffer {
  return encode({ type: 'close', target: 'S', name });
}

/** Parse of `sql` under `name` ('' the unnamed statement), every parameter text. */
export function parseStatement(name: string, st: Pick<FenceStatement, 'sql' | 'values'>): Buffer {
  return encode({ type: 'parse', name, text: st.sql, paramTypes: new Array<number>(st.values.length).fill(TEXT_OID) });
}

/** Bind of statement `name` to the unnamed portal, then Execute. */
export function bindAndExecute(name: string, values: readonly (string | null)[]): Buffer {
  return Buffer.concat([encode({ type: 'bind', portal: '', statement: name, values }), EXECUTE]);
}

/** Close/Parse/Bind/Execute of the refusal of a CALL or DO outside a transaction block (it always fails). */
export function runRoutineRefusal(): Buffer {
  return Buffer.concat([
    closeStatement(ROUTINE_STATEMENT),
    parseStatement(ROUTINE_STATEMENT, { sql: REFUSE_ROUTINE_SQL, values: [] }),
    bindAndExecute(ROUTINE_STATEMENT, []),
  ]);
}

const lit = (v: string | null) => (v === null ? 'NULL' : pg.escapeLiteral(v));

function statement(sql: string, values: readonly (string | null)[], text: string): FenceStatement {
  return { sql, values, text, bound: bindAndExecute('', values) };
}

function fenceOf(...list: [FenceStatement] | [FenceStatement, FenceStatement]): FenceStatements {
  return { list, text: list.map((st) => `${st.text};`).join('') };
}

/**
 * A session fenced at its fence key's current epoch, `epoch` its oid as fence_session left it
 * (fencer.ts): the epoch's proof, in the writer's transaction mode.
 */
export function provenFence(fenceKey: string, token: bigint, epoch: string): FenceStatements {
  const values = [epoch, fenceKey, token.toString()];
  const [e, key, t] = values.map(lit) as [string, string, string];
  return fenceOf(statement(PROOF_SQL, values, proofText(e, key, t)));
}

/** A session without a token: read-only. */
export function readOnlyFence(): FenceStatements {
  return fenceOf(statement(READ_ONLY_SQL, [], READ_ONLY_SQL));
}

/** A transaction the fencer refuses: it fails with `error` before the writer's first statement. */
export function refusedFence(error: ErrorFields): FenceStatements {
  const values = [error.code, error.message, error.detail ?? null, error.hint ?? null];
  return fenceOf(statement(REFUSE_SQL, values, `${READ_ONLY_PREFIX}fencepost_api.refuse_transaction(${values.map(lit).join(', ')})`));
}

/** The refusal in the fence's place while writes are refused (REFUSE_UNSAFE_SQL). */
export function refusalInPlaceOfFence(): FenceStatements {
  return fenceOf(statement(RW_SQL, [], RW_SQL), statement(REFUSE_UNSAFE_SQL, [], REFUSE_UNSAFE_SQL));
}

/** A Query that makes the session's transactions read-only by default again (see planner.ts). */
export const RESET_READ_ONLY_SQL = 'SET default_transaction_read_only = on';

/** The fence key, token and highest token of an FP409's detail (src/fence/detail.ts). */
export const staleDetail = parseStaleDetail;

// Blanks every supported server's lexer reads as blanks (not JavaScript's \s, which takes U+00A0
// and others the server reads as part of a word; not \v, a blank only from Postgres 16 on).
const B = '[ \\t\\n\\r\\f]';
const BEGIN_MODE = `(?:ISOLATION${B}+LEVEL${B}+(?:SERIALIZABLE|REPEATABLE${B}+READ|READ${B}+COMMITTED|READ${B}+UNCOMMITTED)|READ${B}+WRITE|READ${B}+ONLY|(?:NOT${B}+)?DEFERRABLE)`;
const DEFERRABLE_BEGIN = new RegExp(
  `^${B}*(?:(BEGIN)(?:${B}+(?:WORK|TRANSACTION))?|(START)${B}+TRANSACTION)(${B}+${BEGIN_MODE}(?:${B}*,?${B}*${BEGIN_MODE})*)?${B}*;?${B}*$`,
  'i',
);

/**
 * A lone BEGIN or START TRANSACTION, with transaction modes at most (no comment, nothing else) —
 * one the proxy may answer itself and send later (planner.ts): its CommandComplete tag, else null.
 */
export function deferrableBegin(sql: string): string | null {
  const m = DEFERRABLE_BEGIN.exec(sql);
  if (m === null) return null;
  return m[2] !== undefined ? 'START TRANSACTION' : 'BEGIN';
}

/** A lone BEGIN or START TRANSACTION without transaction modes (deferrableBegin's, no mode). */
export function plainBegin(sql: string): boolean {
  const m = DEFERRABLE_BEGIN.exec(sql);
  return m !== null && m[3] === undefined;
}
