// The current definition of every SQL function and view of the fencepost schema, built from the
// fence rule's fragments (rule.ts). Migrations are history for tables; these exist once, in current
// form, and migrate() re-applies them whenever they change (recorded in fencepost.definitions,
// migration 0015). A fresh install and an upgrade end with the same schema: migrations/schema.sql
// is its dump, checked by test/fence/schema.test.ts.
//
// Bump DEFINITIONS_VERSION with every change that ships: a proxy applies its definitions over an
// older version's, never over a newer one's (a rolling upgrade never takes the functions back).
// Parameter names and result columns of an existing function cannot change here (CREATE OR
// REPLACE refuses); such a change is a migration that drops the old one first.
import { createHash } from 'node:crypto';
import { NOT_FENCED, RAISE_FIRST, STALE_TOKEN } from './codes.ts';
import { staleDetailSql } from './detail.ts';
import { MAX_KEY_BYTES } from './key.ts';
import {
  BACKEND_START_SQL,
  boundCapabilitySql,
  CAPABILITY_SECRET_SQL,
  epochProof,
  EPOCH_OID_SETTING,
  NO_PREPARE_READ,
  NO_PREPARE_SEQUENCE,
  refuseUnlessProxy,
} from './rule.ts';

export const DEFINITIONS_VERSION = 13;

/**
 * The schema of the functions client logins and keys' roles call (migration 0019): functions only,
 * no table or sequence, so nothing in it is worth a lock another tenant needs. Those roles have no
 * USAGE on schema fencepost: they cannot name its tables or epoch sequences, not even in DDL that
 * Postgres would lock before checking ownership.
 */
export const CLIENT_SCHEMA = 'fencepost_api';

interface Definition {
  /** The function's signature as GRANT and REVOKE name it, or the view's name. */
  name: string;
  sql: string;
  /** EXECUTE is revoked from PUBLIC (the function is the proxy's only). */
  revoke: boolean;
  /** Client logins and the keys' roles may EXECUTE it (the functions the proxy calls as them). */
  client: boolean;
}

// pg_trigger.tgtype of the protect triggers (protect.ts): bits ROW 1, BEFORE 2, INSERT 4, DELETE 8,
// UPDATE 16, TRUNCATE 32. A protected table's fires BEFORE each INSERT, UPDATE, DELETE or TRUNCATE
// statement; fencepost.objects's BEFORE each INSERT or UPDATE row.
const TABLE_TRIGGER_TYPE = 2 | 4 | 8 | 16 | 32;
const OBJECTS_TRIGGER_TYPE = 1 | 2 | 4 | 16;
const PROXY_FUNCTION = 'LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp';

/**
 * The SQL endpoint's proof (prove_epoch, and the procedure prove): while the epoch the session was
 * fenced in still exists, rule.ts epochProof and the no-PREPARE read; else refuse_unproven_session.
 */
const PROVE_EPOCH_BODY = `BEGIN
  IF pg_catalog.pg_relation_filenode(epoch) IS NOT NULL THEN
    PERFORM ${epochProof('epoch')}, ${NO_PREPARE_READ};
  ELSE
    PERFORM fencepost.refuse_unproven_session(fence_key, token);
  END IF;
END`;

const definitions: readonly Definition[] = [
  {
    // The fence's two promises, enforced whoever runs the SQL: a fence's highest token never goes
    // down, and fence rows are never deleted (the triggers of migration 0003 call this).
    name: 'fencepost.refuse_fence_change()',
    revoke: false,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.refuse_fence_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    RAISE EXCEPTION 'fence % may not go down from % to %', OLD.fence_key, OLD.highest_token, NEW.highest_token
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RAISE EXCEPTION 'fence rows are never deleted (%)', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END $$`,
  },
  {
    // The epoch sequence's name of a fence key (rule.ts epochName computes the same).
    name: 'fencepost.epoch_name(text)',
    revoke: false,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.epoch_name(fence_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$ SELECT 'epoch_' || left(encode(sha256(convert_to(fence_key, 'UTF8')), 'hex'), 56) $$`,
  },
  {
    // The trigger fences_next_epoch (migration 0018) on every raise of a fence: its epoch, if it
    // has one (made by the first session that fences it), is dropped and made anew, which voids
    // every session fenced in the old one. The DROP waits for every transaction that holds the old
    // epoch (rule.ts epochProof); raise.ts ends them after its wait.
    name: 'fencepost.next_epoch()',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.next_epoch() RETURNS trigger
${PROXY_FUNCTION} AS $$
DECLARE
  v_name text := fencepost.epoch_name(NEW.fence_key);
BEGIN
  IF to_regclass('fencepost.' || quote_ident(v_name)) IS NOT NULL THEN
    EXECUTE format('DROP SEQUENCE fencepost.%I', v_name);
    -- The owner's only: the proof (currval) runs in functions of the owner's (prove_*).
    EXECUTE format('CREATE SEQUENCE fencepost.%I', v_name);
  END IF;
  RETURN NULL;
END $$`,
  },
  {
    // A session's setup, before its first fence: the session's temporary sequence (rule.ts
    // NO_PREPARE_READ), made once per backend, and the backend's start (rule.ts BACKEND_START_SQL),
    // which the proxy binds the session's capabilities to. Harmless to anyone: it fences nothing.
    name: 'fencepost_api.session_start()',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost_api.session_start() RETURNS text
${PROXY_FUNCTION} AS $$
BEGIN
  IF to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}') IS NULL THEN
    CREATE TEMPORARY SEQUENCE ${NO_PREPARE_SEQUENCE};
    GRANT SELECT ON SEQUENCE pg_temp.${NO_PREPARE_SEQUENCE} TO PUBLIC;
  END IF;
  RETURN ${BACKEND_START_SQL};
END $$`,
  },
  {
    // The session fence of both SQL doors (rule.ts): called by the proxy on the writer's own
    // backend, once per session and (fence key, token), in a transaction of its own. Makes the
    // session's temporary sequence (rule.ts NO_PREPARE_READ) once per backend; with a fence key,
    // returns the fence's highest token (null: no fence yet) and, when that is the token, defines
    // currval() of the fence's epoch in this session: the session passed the fence. It never raises
    // a fence (raise.ts does, in a transaction of the proxy's). The capability is checked before
    // anything is read or locked; a stale token reads the fence without locking it; the token's
    // own fence row is shared until this call's transaction ends, so no raise commits in between
    // (a raise updates the row before it replaces the epoch: the same lock order as here), and in
    // REPEATABLE READ a raise committed after the snapshot fails the lock (40001).
    name: 'fencepost_api.fence_session(text, text, bigint)',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost_api.fence_session(session_capability text, fence_key text, token bigint)
RETURNS bigint
${PROXY_FUNCTION} AS $$
DECLARE
  v_secret text := ${CAPABILITY_SECRET_SQL};
  v_highest bigint;
  v_name text;
  v_seq regclass;
BEGIN
  -- Sizes first: nothing of an oversized call is hashed, read or locked.
  IF octet_length(session_capability) > 64 OR octet_length(fence_key) > ${MAX_KEY_BYTES} THEN
    RAISE EXCEPTION 'fencepost_api.fence_session: argument too long (capability % bytes, fence key % bytes; at most 64 and ${MAX_KEY_BYTES})', octet_length(session_capability), octet_length(fence_key)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  ${refuseUnlessProxy('fence_session', 'session_capability', boundCapabilitySql('v_secret', ["'fence_session'", 'fence_key', 'token::text']))}
  IF to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}') IS NULL THEN
    CREATE TEMPORARY SEQUENCE ${NO_PREPARE_SEQUENCE};
    GRANT SELECT ON SEQUENCE pg_temp.${NO_PREPARE_SEQUENCE} TO PUBLIC;
  END IF;
  IF fence_key IS NULL OR token IS NULL THEN
    RETURN NULL;
  END IF;
  PERFORM pg_catalog.set_config('${EPOCH_OID_SETTING}', '', false);
  SELECT f.highest_token INTO v_highest FROM fencepost.fences f WHERE f.fence_key = fence_session.fence_key;
  IF v_highest IS DISTINCT FROM token THEN
    RETURN v_highest;
  END IF;
  SELECT f.highest_token INTO v_highest FROM fencepost.fences f WHERE f.fence_key = fence_session.fence_key FOR SHARE;
  IF v_highest IS DISTINCT FROM token THEN
    RETURN v_highest;
  END IF;
  v_name := fencepost.epoch_name(fence_key);
  v_seq := to_regclass('fencepost.' || quote_ident(v_name));
  IF v_seq IS NULL THEN
    -- The fence's first session: its epoch (a concurrent first session may make it first).
    BEGIN
      EXECUTE format('CREATE SEQUENCE fencepost.%I', v_name);
    EXCEPTION WHEN unique_violation OR duplicate_table THEN
      NULL;
    END;
    v_seq := to_regclass('fencepost.' || quote_ident(v_name));
  END IF;
  PERFORM nextval(v_seq);
  -- For the SQL endpoint's proof (prove_epoch): which epoch this session was fenced in, read back by the proxy.
  PERFORM pg_catalog.set_config('${EPOCH_OID_SETTING}', v_seq::oid::text, false);
  RETURN v_highest;
END $$`,
  },
  {
    // The SQL endpoint's proof for each transaction of a fenced session (src/proxy/sql/proof.ts):
    // while the epoch the session was fenced in still exists (its oid, which the proxy read back
    // from fencepost.epoch_oid in fence_session's own statement, never from the writer), rule.ts
    // epochProof, which fails unless this session passed the fence in it and holds it until the
    // transaction ends, and the no-PREPARE read; else refuse_unproven_session (FP409 with the
    // highest token, or FP428). Every raise drops the epoch and makes a new one, so an oid that
    // still names a relation is the current epoch. By oid, not by name: no name is parsed or looked
    // up per transaction (measured: about 20 us of Postgres CPU per transaction under 16 clients,
    // docs/performance.md). A caller's own oid can only make its own transaction fail: currval()
    // decides, and its lock lasts only as long as the transaction when currval() succeeds, which
    // only a session the proxy fenced in that epoch can make it do. No exception block (no
    // subtransaction), no SET clause (it would cost a GUC save and restore per call): every name
    // and operator is qualified, so the caller's search_path cannot reach into it. SECURITY
    // DEFINER: the epoch sequences are the owner's alone.
    name: 'fencepost_api.prove_epoch(oid, text, bigint)',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost_api.prove_epoch(epoch oid, fence_key text, token bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
${PROVE_EPOCH_BODY} $$`,
  },
  {
    // prove_epoch as a procedure, for the proof the SQL endpoint writes into a Query's text
    // (proof.ts): CALL is a utility statement, neither planned nor answered with a row. Measured
    // straight to Postgres 15 (one client, in front of an UPDATE in one Query): about 20 us of
    // Postgres CPU per transaction where SELECT prove_epoch(…) took about 48 (docs/performance.md).
    // Only ever in a transaction block or a multi-statement Query (an implicit block), so atomic:
    // it cannot commit, and its currval() lock lasts until the writer's transaction ends.
    name: 'fencepost_api.prove(oid, text, bigint)',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE PROCEDURE fencepost_api.prove(epoch oid, fence_key text, token bigint)
LANGUAGE plpgsql SECURITY DEFINER AS $$
${PROVE_EPOCH_BODY} $$`,
  },
  {
    // The SQL endpoint's proof before definitions version 12 (by the epoch's name, compared with
    // fencepost.epoch_oid): kept for proxies of an older version during a rolling upgrade.
    name: 'fencepost_api.prove_transaction(text, text, bigint)',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost_api.prove_transaction(epoch text, fence_key text, token bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
  IF pg_catalog.to_regclass(epoch)::pg_catalog.oid::pg_catalog.text OPERATOR(pg_catalog.=) pg_catalog.current_setting('${EPOCH_OID_SETTING}', true) THEN
    PERFORM ${epochProof('epoch')}, ${NO_PREPARE_READ};
  ELSE
    PERFORM fencepost.refuse_unproven_session(fence_key, token);
  END IF;
END $$`,
  },
  {
    // The proof of /v1/transactions (sql/transactions.ts openClientTransaction): for each epoch sequence
    // named, rule.ts epochProof (55000 or XX000 when a raise replaced it since the connection was
    // fenced, 42P01 before the fence's first session made it), then the no-PREPARE read. Qualified
    // names only, SECURITY DEFINER without a SET clause, as prove_transaction.
    name: 'fencepost_api.prove_epochs(text[])',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost_api.prove_epochs(epochs text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
  PERFORM ${epochProof('e')} FROM pg_catalog.unnest(epochs) AS u(e);
  PERFORM ${NO_PREPARE_READ};
END $$`,
  },
  {
    // Why a session's proof failed, as its error: FP409 when the fence is above its token (a newer
    // leader raised it), else FP428 (the session lost its fence some other way, say DISCARD
    // SEQUENCES in a function: the proxy fences it again before the next transaction).
    name: 'fencepost.refuse_unproven_session(text, bigint)',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.refuse_unproven_session(fence_key text, token bigint) RETURNS void
${PROXY_FUNCTION} AS $$
DECLARE
  v_highest bigint := (SELECT f.highest_token FROM fencepost.fences f WHERE f.fence_key = refuse_unproven_session.fence_key);
BEGIN
  IF v_highest > token THEN
    RAISE EXCEPTION 'stale fencing token: token % is below the highest token % of fence key %', token, v_highest, to_json(fence_key)
      USING ERRCODE = '${STALE_TOKEN}',
            DETAIL = ${staleDetailSql('fence_key', 'token', 'v_highest')},
            HINT = 'a newer leader holds this fence: nothing of this transaction was applied';
  END IF;
  RAISE EXCEPTION 'this session is no longer fenced at token % of fence key %', token, to_json(fence_key)
    USING ERRCODE = '${RAISE_FIRST}',
          HINT = 'the proxy fences the session again before its next transaction; nothing of this transaction was applied, safe to retry';
END $$`,
  },
  {
    // The SQL endpoint's refusal of a transaction the proxy decided not to let write (a stale or
    // unverified token, a fence that could not be raised, malformed settings: src/proxy/sql/fencer.ts),
    // run in the place of the session's proof so the transaction fails before the writer's first
    // statement. It only raises what it is given: anyone may call it, to no effect on anyone else.
    name: 'fencepost_api.refuse_transaction(text, text, text, text)',
    revoke: false,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost_api.refuse_transaction(code text, message text, detail text, hint text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = coalesce(detail, ''), HINT = coalesce(hint, '');
END $$`,
  },
  {
    // The session reset's DISCARD TEMP (session-reset.ts), done only when the session has temporary
    // objects besides the fence's own sequence (rule.ts NO_PREPARE_SEQUENCE), which would otherwise be
    // dropped and made again by every transaction (a catalog write each).
    name: 'fencepost_api.discard_temp()',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost_api.discard_temp() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF EXISTS (SELECT FROM pg_depend d WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = pg_my_temp_schema()
             AND NOT (d.classid = 'pg_class'::regclass AND d.objid = coalesce(to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}'), 0))) THEN
    DISCARD TEMP;
  END IF;
END $$`,
  },
  {
    // The trigger of every protected table (src/fence/protect.ts), FOR EACH STATEMENT before
    // INSERT, UPDATE, DELETE and TRUNCATE (COPY FROM and MERGE fire them too), with the fence key
    // and its epoch sequence as arguments: the statement goes on only in a session that passed that
    // fence in its current epoch (rule.ts epochProof), whoever sends it. The proof holds the epoch
    // until the transaction ends, so no raise commits before it does. No fence row is read, locked
    // or counted: two C calls, in a block that turns their errors into FP403.
    name: 'fencepost.refuse_unfenced_write()',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.refuse_unfenced_write() RETURNS trigger
${PROXY_FUNCTION} AS $$
BEGIN
  BEGIN
    PERFORM ${epochProof("CASE WHEN TG_NARGS > 1 THEN TG_ARGV[1] ELSE 'fencepost.' || fencepost.epoch_name(TG_ARGV[0]) END")}, ${NO_PREPARE_READ};
  EXCEPTION WHEN object_not_in_prerequisite_state OR undefined_table OR internal_error THEN
    RAISE EXCEPTION '% on %.% refused: this session did not pass the fence of fence key % in its current epoch', TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), to_json(TG_ARGV[0])
      USING ERRCODE = '${NOT_FENCED}',
            DETAIL = format('protected table %s.%s, fence key %s', quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), to_json(TG_ARGV[0])),
            HINT = format('write it through the fencepost proxy with fencepost.fence_key = %s and the leader''s fencepost.token (SQL endpoint), or with that fence key on POST /v1/transactions; a newer leader''s raise ends an older token''s sessions; nothing of this statement was applied', to_json(TG_ARGV[0]));
  END;
  RETURN NULL;
END $$`,
  },
  {
    // The trigger on fencepost.objects while any prefix is protected (src/fence/protect.ts), FOR
    // EACH ROW before INSERT and UPDATE: an object under a protected prefix (the longest one that
    // matches) is written under that prefix's fence key, whatever the request's Fence-Key said. The
    // proxy resolves the fence key the same way; this refuses a write it resolved otherwise.
    name: 'fencepost.refuse_misfenced_object()',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.refuse_misfenced_object() RETURNS trigger
${PROXY_FUNCTION} AS $$
BEGIN
  PERFORM fencepost.object_fence_ok(NEW.key, NEW.fence_key);
  RETURN NEW;
END $$`,
  },
  {
    // The check itself: true, or FP403 for an object under a protected prefix (the longest that
    // matches) with another fence key. The objects trigger calls it for INSERT and UPDATE; a DELETE
    // of the HTTP door calls it in its WHERE (sql/objects.ts fencedWrite: a row trigger cannot see the
    // fence key a delete was sent with).
    name: 'fencepost.object_fence_ok(text, text)',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.object_fence_ok(object_key text, fence_key text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_prefix text;
  v_fence_key text;
BEGIN
  SELECT p.prefix, p.fence_key INTO v_prefix, v_fence_key FROM fencepost.protected_prefixes p
  WHERE starts_with(object_key, p.prefix) ORDER BY octet_length(p.prefix) DESC LIMIT 1;
  IF FOUND AND v_fence_key IS DISTINCT FROM object_fence_ok.fence_key THEN
    RAISE EXCEPTION 'object % is under protected prefix %: it is fenced by fence key %, not %', to_json(object_key), to_json(v_prefix), to_json(v_fence_key), to_json(object_fence_ok.fence_key)
      USING ERRCODE = '${NOT_FENCED}',
            DETAIL = format('protected prefix %s, fence key %s', to_json(v_prefix), to_json(v_fence_key)),
            HINT = format('send Fence-Key: %s with the leader''s token; nothing was applied', v_fence_key);
  END IF;
  RETURN true;
END $$`,
  },
  {
    // Why the trigger fencepost_fence on a relation does not enforce the fence, or NULL when it
    // does: it exists, fires in ordinary sessions (origin or always; not disabled, not replica-only),
    // calls the fence's function with exactly the declared arguments, at the declared events, with
    // no WHEN condition and no column list. Anything else lets a write through.
    name: 'fencepost.trigger_problem(regclass, regprocedure, smallint, bytea)',
    revoke: false,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.trigger_problem(rel regclass, fn regprocedure, kind smallint, args bytea) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
  SELECT CASE
    WHEN g.oid IS NULL THEN 'its trigger fencepost_fence is missing'
    WHEN g.tgenabled = 'D' THEN 'its trigger is disabled'
    WHEN g.tgenabled = 'R' THEN 'its trigger fires only in replica sessions (ENABLE REPLICA TRIGGER)'
    WHEN g.tgfoid <> fn THEN format('its trigger calls %s, not %s', g.tgfoid::regprocedure, fn)
    WHEN g.tgtype <> kind THEN 'its trigger does not fire at the events it was declared for'
    WHEN g.tgqual IS NOT NULL THEN 'its trigger has a WHEN condition'
    WHEN cardinality(g.tgattr::int2[]) > 0 THEN 'its trigger fires only on updates of some columns'
    WHEN g.tgargs <> args THEN 'its trigger has other arguments than the declared fence key'
  END
  FROM (SELECT 1) one
  LEFT JOIN pg_catalog.pg_trigger g ON g.tgrelid = rel AND g.tgname = 'fencepost_fence'
$$`,
  },
  {
    // What is protected, for operators at a psql prompt and for `fencepost protect --list`.
    name: 'fencepost.protected_data',
    revoke: false,
    client: false,
    sql: `
CREATE OR REPLACE VIEW fencepost.protected_data AS
  SELECT kind, target, fence_key, declared_at, why_not IS NULL AS enforced, why_not
  FROM (
    SELECT 'table'::text AS kind, coalesce(t.relation::regclass::text, t.relation::text) AS target, t.fence_key, t.declared_at,
      fencepost.trigger_problem(t.relation, 'fencepost.refuse_unfenced_write()'::regprocedure, ${TABLE_TRIGGER_TYPE}::smallint,
        convert_to(t.fence_key, 'UTF8') || '\\x00'::bytea || convert_to('fencepost.' || fencepost.epoch_name(t.fence_key), 'UTF8') || '\\x00'::bytea) AS why_not
    FROM fencepost.protected_tables t
    UNION ALL
    SELECT 'prefix' AS kind, p.prefix AS target, p.fence_key, p.declared_at,
      fencepost.trigger_problem('fencepost.objects'::regclass, 'fencepost.refuse_misfenced_object()'::regprocedure, ${OBJECTS_TRIGGER_TYPE}::smallint, ''::bytea)
    FROM fencepost.protected_prefixes p
  ) d`,
  },
  {
    // Each fence with its counts, for operators at a psql prompt (the proxy reads the same sums):
    // the counter rows plus the transactions and writes committed but not folded yet.
    name: 'fencepost.fence_stats',
    revoke: false,
    client: false,
    sql: `
CREATE OR REPLACE VIEW fencepost.fence_stats AS
  SELECT f.fence_key, f.highest_token, f.created_at, f.updated_at,
    (coalesce(sum(c.accepted), 0) + coalesce(max(p.n), 0))::bigint AS accepted, coalesce(sum(c.rejected), 0)::bigint AS rejected,
    f.raised_by
  FROM fencepost.fences f
  LEFT JOIN fencepost.fence_counts c USING (fence_key)
  LEFT JOIN (SELECT s.fence_key, count(*) AS n FROM fencepost.pending_counts s GROUP BY s.fence_key) p USING (fence_key)
  GROUP BY f.fence_key`,
  },
];

/** Every definition, in order, as one script (the functions' privileges included). */
export const DEFINITIONS_SQL = definitions
  .map((d) => `${d.sql.trim()};\n${d.revoke ? `REVOKE ALL ON ROUTINE ${d.name} FROM PUBLIC;\n` : ''}`)
  .join('\n');

/** What migrate() records, to know whether the database has these definitions. */
export const DEFINITIONS_SHA256 = createHash('sha256').update(DEFINITIONS_SQL, 'utf8').digest('hex');

/** The functions the proxy calls as a client login (or a key's role): what they are granted. */
export const CLIENT_FUNCTIONS: readonly string[] = definitions.filter((d) => d.client).map((d) => d.name);
