// The current definition of every SQL function and view of the fencepost schema, built from the
// fence rule's fragments (sql/rule.ts). Migrations are history for tables; these exist once, in current
// form, and migrate() re-applies them whenever they change (recorded in fencepost.definitions,
// migration 0015). A fresh install and an upgrade end with the same schema: migrations/schema.sql
// is its dump, checked by test/fence/schema.test.ts.
//
// Bump DEFINITIONS_VERSION with every change that ships: a proxy applies its definitions over an
// older version's, never over a newer one's (a rolling upgrade never takes the functions back).
// Parameter names and result columns of an existing function cannot change here (CREATE OR
// REPLACE refuses); such a change is a migration that drops the old one first.
import { createHash } from 'node:crypto';
import { INVALID_FENCE_SETTING, NOT_FENCED, RAISE_FIRST } from './codes.ts';
import { MAX_KEY_BYTES } from './key.ts';
import {
  BACKEND_START_SQL,
  BACKEND_START_TIMESTAMP_SQL,
  boundCapabilitySql,
  CAPABILITY_SECRET_SQL,
  NO_PREPARE_SEQUENCE,
  refuseUnlessProxy,
} from './sql/rule.ts';

export const DEFINITIONS_VERSION = 15;

/**
 * The schema of the functions client logins and keys' roles call (migration 0019): functions only,
 * no table or sequence, so nothing in it is worth a lock another tenant needs. Those roles have no
 * USAGE on schema fencepost: they cannot name its tables or sequences, not even in DDL that
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
    // A session's setup, before its first fence: the session's temporary sequence (sql/rule.ts
    // NO_PREPARE_READ), made once per backend, and the backend's start (sql/rule.ts BACKEND_START_SQL),
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
    // The connection fence of both SQL doors (sql/rule.ts): called by the proxy on the writer's own
    // backend, once per connection and fence key (the SQL endpoint at startup, before the writer's
    // first message; /v1/transactions when a pooled connection serves another set of fences), in a
    // transaction of its own. With a fence key, returns the fence's highest token (null: no fence yet) and,
    // when that is the token, records this backend in fencepost.fenced_backends: the connection
    // passed the fence. It never raises a fence (raise.ts does, in a transaction of the proxy's
    // own). The capability is checked before anything is read or locked; a stale token reads the
    // fence without locking it; the token's own fence row is shared until this call's transaction
    // ends, so a raise (which updates the row, then reads the registry in a statement of its own:
    // revoke_older_sessions) sees this backend's row once it gets the row.
    //
    // The backend's identity is its serial, currval(fencepost.session_serial): only nextval()
    // defines currval, only this function calls nextval (no one else has any privilege on the
    // sequence), and a sequence never returns a value twice, so a serial names one backend for
    // good; a later backend with the same pid has no currval at all. The row also keeps the
    // fencepost settings the session had when it was fenced: a protected table refuses a session
    // that SET others since (refuse_unfenced_write: reconnect with the new token).
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
  v_serial bigint;
BEGIN
  -- Sizes first: nothing of an oversized call is hashed, read or locked.
  IF octet_length(session_capability) > 64 OR octet_length(fence_key) > ${MAX_KEY_BYTES} THEN
    RAISE EXCEPTION 'fencepost_api.fence_session: argument too long (capability % bytes, fence key % bytes; at most 64 and ${MAX_KEY_BYTES})', octet_length(session_capability), octet_length(fence_key)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  ${refuseUnlessProxy('fence_session', 'session_capability', boundCapabilitySql('v_secret', ["'fence_session'", 'fence_key', 'token::text']))}
  IF fence_key IS NULL OR token IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT f.highest_token INTO v_highest FROM fencepost.fences f WHERE f.fence_key = fence_session.fence_key;
  IF v_highest IS DISTINCT FROM token THEN
    RETURN v_highest;
  END IF;
  SELECT f.highest_token INTO v_highest FROM fencepost.fences f WHERE f.fence_key = fence_session.fence_key FOR SHARE;
  IF v_highest IS DISTINCT FROM token THEN
    RETURN v_highest;
  END IF;
  -- A backend with no row yet (every SQL endpoint connect) takes a serial; one with rows keeps its
  -- serial unless DISCARD SEQUENCES forgot it (no currval: the exception block's subtransaction).
  IF NOT EXISTS (SELECT FROM fencepost.fenced_backends b WHERE b.pid = pg_backend_pid()) THEN
    v_serial := nextval('fencepost.session_serial');
  ELSE
    BEGIN
      v_serial := currval('fencepost.session_serial');
    EXCEPTION WHEN object_not_in_prerequisite_state THEN
      v_serial := nextval('fencepost.session_serial');
    END;
  END IF;
  -- Rows of an earlier backend with this pid, and this backend's earlier fence of this key.
  DELETE FROM fencepost.fenced_backends b
   WHERE b.pid = pg_backend_pid() AND (b.serial <> v_serial OR b.fence_key = fence_session.fence_key);
  INSERT INTO fencepost.fenced_backends (pid, fence_key, backend_start, serial, token, token_setting, fence_key_setting)
  VALUES (pg_backend_pid(), fence_session.fence_key, ${BACKEND_START_TIMESTAMP_SQL}, v_serial, token,
          current_setting('fencepost.token', true), current_setting('fencepost.fence_key', true));
  RETURN v_highest;
END $$`,
  },
  {
    // The raise's revocation (trigger fences_revoke_older, migration 0020): on every raise of a
    // fence, whatever path raised it (raise.ts, the HTTP door's in-statement raise, a hand-written
    // UPDATE), in the raise's own transaction and with the fence row locked by it. The backends
    // fenced at an older token of that key: waits up to fencepost.raise_wait_ms (default 1000, at
    // most 600000) for the transactions they had open when the raise got here (not for ones they
    // start after: a busy zombie cannot starve it), terminates every one still alive (same pid
    // and backend start), waits until each is gone from pg_stat_activity (500 ms more at most,
    // else the raise fails with 55P03 and nothing commits), and deletes their rows. So once a
    // raise commits, no backend fenced at an older token is alive. It locks nothing but the
    // registry's rows, drops nothing and reads nothing other roles can create: no role can pin it.
    // Other roles' backend starts and transaction starts need pg_read_all_stats (or a superuser
    // owner), terminating them pg_signal_backend.
    name: 'fencepost.revoke_older_sessions()',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.revoke_older_sessions() RETURNS trigger
${PROXY_FUNCTION} AS $$
DECLARE
  v_began timestamptz := clock_timestamp();
  v_wait_ms int := least(greatest(coalesce(nullif(current_setting('fencepost.raise_wait_ms', true), '')::int, 1000), 0), 600000);
  v_exit_ms int := 500;
  v_pids int[];
  v_starts timestamptz[];
  v_left int;
BEGIN
  SELECT array_agg(b.pid), array_agg(b.backend_start) INTO v_pids, v_starts
    FROM fencepost.fenced_backends b
   WHERE b.fence_key = NEW.fence_key AND b.token < NEW.highest_token AND b.pid <> pg_backend_pid();
  IF v_pids IS NULL THEN
    RETURN NULL;
  END IF;
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    -- A snapshot older than the registry's rows would miss the backends fenced meanwhile.
    RAISE EXCEPTION 'a fence is raised in READ COMMITTED only' USING ERRCODE = '${RAISE_FIRST}';
  END IF;
  LOOP
    PERFORM pg_stat_clear_snapshot();
    EXIT WHEN NOT EXISTS (SELECT FROM pg_stat_get_activity(NULL) a JOIN unnest(v_pids, v_starts) r(pid, st) ON a.pid = r.pid AND a.backend_start = r.st
                           WHERE a.xact_start < v_began);
    EXIT WHEN clock_timestamp() >= v_began + make_interval(secs => v_wait_ms / 1000.0);
    PERFORM pg_sleep(0.002);
  END LOOP;
  PERFORM pg_stat_clear_snapshot();
  PERFORM pg_terminate_backend(a.pid) FROM pg_stat_get_activity(NULL) a JOIN unnest(v_pids, v_starts) r(pid, st) ON a.pid = r.pid AND a.backend_start = r.st;
  LOOP
    PERFORM pg_stat_clear_snapshot();
    SELECT count(*) INTO v_left FROM pg_stat_get_activity(NULL) a JOIN unnest(v_pids, v_starts) r(pid, st) ON a.pid = r.pid AND a.backend_start = r.st;
    EXIT WHEN v_left = 0;
    IF clock_timestamp() >= v_began + make_interval(secs => (v_wait_ms + v_exit_ms) / 1000.0) THEN
      RAISE EXCEPTION 'the raise of fence % to token % failed: % backend(s) fenced at an older token did not exit', to_json(NEW.fence_key), NEW.highest_token, v_left
        USING ERRCODE = 'lock_not_available',
              HINT = 'nothing was committed; a superuser''s backend cannot be ended by the fence: retry, or end it';
    END IF;
    PERFORM pg_sleep(0.001);
  END LOOP;
  DELETE FROM fencepost.fenced_backends b
   WHERE b.fence_key = NEW.fence_key AND b.token < NEW.highest_token AND b.pid <> pg_backend_pid();
  RETURN NULL;
END $$`,
  },
  {
    // The session reset's DISCARD TEMP (session-reset.ts), done only when the session has temporary
    // objects besides the fence's own sequence (sql/rule.ts NO_PREPARE_SEQUENCE), which would otherwise be
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
    // as its argument: the statement goes on only on a backend whose connection passed that
    // fence (fence_session; a raise ends every backend fenced at an older token before it commits),
    // whoever sends it. One lookup of this backend's row, nothing locked; then the no-PREPARE read
    // (sql/rule.ts NO_PREPARE_READ) of the session's temporary sequence, made here at the session's
    // first protected write (a connect makes none: most connections never need one).
    // Refusals: FP403 (not fenced for this key, or the row of an earlier backend with this pid),
    // FP400 (the session SET other fencepost settings since it was fenced: reconnect), 55000 from
    // currval() after DISCARD ALL / SEQUENCES (the connection's fence is gone: reconnect). No SET
    // clause (a GUC save and restore per call) and no exception block (a subtransaction): every
    // name and operator is qualified, so the caller's search_path cannot reach into it.
    name: 'fencepost.refuse_unfenced_write()',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.refuse_unfenced_write() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
  v_serial pg_catalog.int8;
  v_token pg_catalog.text;
  v_key pg_catalog.text;
  v_token_now pg_catalog.text;
  v_key_now pg_catalog.text;
  v_no_prepare pg_catalog.regclass;
BEGIN
  SELECT b.serial, b.token_setting, b.fence_key_setting INTO v_serial, v_token, v_key
    FROM fencepost.fenced_backends b
   WHERE b.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() AND b.fence_key OPERATOR(pg_catalog.=) TG_ARGV[0];
  IF NOT FOUND OR v_serial OPERATOR(pg_catalog.<>) pg_catalog.currval('fencepost.session_serial'::pg_catalog.regclass) THEN
    RAISE EXCEPTION '% on %.% refused: this connection did not pass the fence of fence key %', TG_OP, pg_catalog.quote_ident(TG_TABLE_SCHEMA), pg_catalog.quote_ident(TG_TABLE_NAME), pg_catalog.to_json(TG_ARGV[0])
      USING ERRCODE = '${NOT_FENCED}',
            DETAIL = pg_catalog.format('protected table %s.%s, fence key %s', pg_catalog.quote_ident(TG_TABLE_SCHEMA), pg_catalog.quote_ident(TG_TABLE_NAME), pg_catalog.to_json(TG_ARGV[0])),
            HINT = pg_catalog.format('write it through the fencepost proxy with fencepost.fence_key = %s and the leader''s fencepost.token in the connection''s startup options (SQL endpoint), or with that fence key on POST /v1/transactions; nothing of this statement was applied', pg_catalog.to_json(TG_ARGV[0]));
  END IF;
  v_token_now := pg_catalog.current_setting('fencepost.token', true);
  v_key_now := pg_catalog.current_setting('fencepost.fence_key', true);
  IF NOT (coalesce(v_token OPERATOR(pg_catalog.=) v_token_now, v_token IS NULL AND v_token_now IS NULL)
          AND coalesce(v_key OPERATOR(pg_catalog.=) v_key_now, v_key IS NULL AND v_key_now IS NULL)) THEN
    RAISE EXCEPTION '% on %.% refused: fencepost.token or fencepost.fence_key was changed after this connection was fenced at token % of fence key %', TG_OP, pg_catalog.quote_ident(TG_TABLE_SCHEMA), pg_catalog.quote_ident(TG_TABLE_NAME), v_token, pg_catalog.to_json(TG_ARGV[0])
      USING ERRCODE = '${INVALID_FENCE_SETTING}',
            HINT = 'a connection is fenced once, at startup: reconnect with the new token (a new pool), or RESET the settings; nothing of this statement was applied';
  END IF;
  -- The session's temporary sequence, made at its first protected write (a connect makes none).
  v_no_prepare := pg_catalog.to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}');
  IF v_no_prepare IS NULL THEN
    CREATE TEMPORARY SEQUENCE ${NO_PREPARE_SEQUENCE};
    v_no_prepare := pg_catalog.to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}');
  END IF;
  PERFORM pg_catalog.pg_sequence_last_value(v_no_prepare);
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
        convert_to(t.fence_key, 'UTF8') || '\\x00'::bytea) AS why_not
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
