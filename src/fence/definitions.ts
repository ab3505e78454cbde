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
import pg from 'pg';
import { FENCED_TRANSACTION_ENDED, GUARD_UNAVAILABLE, INVALID_FENCE_SETTING, NOT_FENCED, RAISE_FIRST, STALE_TOKEN } from './codes.ts';
import { staleDetailSql, unverifiedDetailSql } from './detail.ts';
import { boundCapabilitySql, CAPABILITY_SECRET_SQL, leaderFastPath, shareFences, markFenced, MARK_SETTING, NO_PREPARE, NO_PREPARE_SEQUENCE, refuseUnlessProxy, transactionMark } from './rule.ts';
import { RESET_SESSION_HEAD } from './session-reset.ts';

export const DEFINITIONS_VERSION = 6;

interface Definition {
  /** The function's signature as GRANT and REVOKE name it, or the view's name. */
  name: string;
  sql: string;
  /** EXECUTE is revoked from PUBLIC (the function is the proxy's only). */
  revoke: boolean;
  /** Client logins and the keys' roles may EXECUTE it (the functions the proxy calls as them). */
  client: boolean;
}

const PROXY_FUNCTION = 'LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp';

/** A bigint token in decimal digits, 0 to 2^63-1 (plpgsql condition over a text). */
const bigintDigits = (raw: string) => `${raw} ~ '^[0-9]+$' AND ltrim(${raw}, '0') ~ '^[0-9]{0,19}$' AND ${raw}::numeric <= 9223372036854775807`;

/** plpgsql DECLARE of the SQL endpoint's session settings as they are in this transaction. */
const SESSION_SETTINGS = `DECLARE
  v_raw   text := current_setting('fencepost.token', true);
  v_key   text := current_setting('fencepost.fence_key', true);
  v_token bigint;
  v_highest bigint;`;

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
    // The fence rule's share step for a transaction's fences, inside the writer's own transaction:
    // each fence at exactly its token is locked FOR SHARE until the transaction ends, and the
    // transaction is marked for its protected tables (rule.ts markFenced). One row per input:
    // highest_token null when the fence is above the token (stale; then no fence of it is raised).
    // A fence that is absent or
    // below its token is never raised here (the raise would commit with the writer's COMMIT, at
    // whatever synchronous_commit the writer chose, and hold the fence row for the length of the
    // writer's transaction): it fails with RAISE_FIRST and the proxy raises it in a transaction of
    // its own (queries.ts raiseFences), then starts again. `xact` is the transaction id (the proxy
    // checks it again before COMMIT). Each fence gets one pending_counts row: counted exactly when
    // the transaction commits, folded into the counters later (queries.ts foldPendingCounts).
    name: 'fencepost.fence_transaction(text, text[], bigint[], text)',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.fence_transaction(capability text, fence_keys text[], tokens bigint[], writer_id text)
RETURNS TABLE (ord int, highest_token bigint, xact bigint)
${PROXY_FUNCTION} AS $$
#variable_conflict use_column
DECLARE
  r record;
  v_ords int[] := '{}';
  v_highest bigint[] := '{}';
  v_raise text[] := '{}';
  v_stale boolean := false;
BEGIN
  ${refuseUnlessProxy('fence_transaction', 'capability', CAPABILITY_SECRET_SQL)}
  FOR r IN
    WITH input AS (
      SELECT (t.n - 1)::int AS ord, t.fence_key, t.token FROM unnest(fence_keys, tokens) WITH ORDINALITY AS t(fence_key, token, n)
    ),
    held AS (
      ${shareFences('input', '>=')}
    )
    SELECT i.ord AS o, i.fence_key AS k, i.token AS t, h.highest_token AS h
    FROM input i LEFT JOIN held h ON h.fence_key = i.fence_key
    ORDER BY i.ord
  LOOP
    IF r.h IS NULL THEN
      v_raise := v_raise || format('%s to %s', to_json(r.k), r.t);
    ELSIF r.h = r.t THEN
      ${markFenced('capability', 'r.k')}
    END IF;
    v_ords := v_ords || r.o;
    v_highest := v_highest || CASE WHEN r.h = r.t THEN r.h WHEN r.h IS NULL THEN r.t END;
    v_stale := v_stale OR r.h > r.t;
  END LOOP;
  IF v_stale THEN
    -- Refused whatever else it holds: no fence of it is raised (a fence to raise reads as passed;
    -- it is not marked, and the proxy rolls the transaction back).
    RETURN QUERY SELECT o, h, txid_current() FROM unnest(v_ords, v_highest) AS x(o, h);
    RETURN;
  END IF;
  IF cardinality(v_raise) > 0 THEN
    RAISE EXCEPTION 'fence % must be raised before a transaction at its token', array_to_string(v_raise, ', ')
      USING ERRCODE = '${RAISE_FIRST}',
            HINT = 'the proxy raises a fence in a transaction of its own, then starts the transaction again; nothing of this transaction was applied';
  END IF;
  INSERT INTO fencepost.pending_counts (fence_key) SELECT DISTINCT k FROM unnest(fence_keys) AS k;
  RETURN QUERY SELECT o, h, txid_current() FROM unnest(v_ords, v_highest) AS x(o, h);
END $$`,
  },
  {
    // POST /v1/transactions: fence_transaction() for a capability bound to this backend and these
    // very arguments, so the call can travel as SQL text in the proxy's first round trip
    // (queries.ts openClientTransaction). pg_stat_activity shows that text to other sessions of the
    // same login; what they read lets only this backend make this same call again, and only in a
    // Query that starts with the session reset, which no writer's statement (one per Parse) can.
    // The arguments are ASCII (fence keys and writer id in hex, tokens in decimal), so no setting
    // an earlier transaction left (client_encoding, standard_conforming_strings) changes their reading.
    name: 'fencepost.fence_transaction_bound(text, text, text, text)',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.fence_transaction_bound(transaction_capability text, fence_keys_hex text, tokens text, writer_id_hex text)
RETURNS TABLE (ord int, highest_token bigint, xact bigint)
${PROXY_FUNCTION} AS $$
#variable_conflict use_column
DECLARE
  v_secret text := ${CAPABILITY_SECRET_SQL};
  v_key    text;
  v_mark   text;
BEGIN
  ${refuseUnlessProxy('fence_transaction_bound', 'transaction_capability', boundCapabilitySql('v_secret', ['fence_keys_hex', 'tokens', 'writer_id_hex']))}
  IF NOT starts_with(current_query(), ${pg.escapeLiteral(RESET_SESSION_HEAD)}) THEN
    RAISE EXCEPTION 'fencepost.fence_transaction_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF strpos(fence_keys_hex, ',') = 0 AND tokens ~ '^[0-9]{1,18}$' THEN
    v_key := convert_from(decode(fence_keys_hex, 'hex'), 'UTF8');
    ${leaderFastPath({ secret: 'v_secret', fenceKey: 'v_key', token: 'tokens::bigint', onHeld: 'RETURN QUERY SELECT 0, tokens::bigint, txid_current();\n    RETURN;' })}
  END IF;
  -- Every fenced transaction reads the temporary sequence: no PREPARE TRANSACTION.
  ${NO_PREPARE}
  RETURN QUERY SELECT f.ord, f.highest_token, f.xact FROM fencepost.fence_transaction(v_secret,
    ARRAY(SELECT convert_from(decode(h, 'hex'), 'UTF8') FROM unnest(string_to_array(fence_keys_hex, ',')) WITH ORDINALITY AS t(h, n) ORDER BY t.n),
    string_to_array(tokens, ',')::bigint[],
    convert_from(decode(writer_id_hex, 'hex'), 'UTF8')) f;
END $$`,
  },
  {
    // The end of a fenced transaction, right before COMMIT in the same Query (queries.ts
    // sealAndCommit): refuses when the transaction is no longer the fenced one, and forces
    // synchronous_commit on until COMMIT (is_local: past this function's own SET clause).
    name: 'fencepost.seal_client_transaction(bigint)',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.seal_client_transaction(fenced_xact bigint)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF txid_current() IS DISTINCT FROM fenced_xact THEN
    RAISE EXCEPTION 'a statement ended the fenced transaction'
      USING ERRCODE = '${FENCED_TRANSACTION_ENDED}';
  END IF;
  PERFORM set_config('synchronous_commit', 'on', true);
END $$`,
  },
  {
    // The session reset's DISCARD TEMP (session-reset.ts), done only when the session has temporary
    // objects besides the fence's own sequence (rule.ts NO_PREPARE_SEQUENCE), which would otherwise be
    // dropped and made again by every transaction (a catalog write each).
    name: 'fencepost.discard_temp()',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.discard_temp() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF EXISTS (SELECT FROM pg_depend d WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = pg_my_temp_schema()
             AND NOT (d.classid = 'pg_class'::regclass AND d.objid = coalesce(to_regclass('pg_temp.${NO_PREPARE_SEQUENCE}'), 0))) THEN
    DISCARD TEMP;
  END IF;
END $$`,
  },
  {
    // The SQL endpoint's fence for a session's transaction: the session's `fencepost.token` and
    // `fencepost.fence_key` settings as they are in this transaction, validated, checked against the
    // key's fence-key prefixes (null in open mode), then the fence rule. A session without a token
    // gets false (the proxy keeps the transaction read-only); a stale token fails the transaction.
    name: 'fencepost.session_fence_check(text[], text)',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.session_fence_check(fence_key_prefixes text[], writer_id text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
${SESSION_SETTINGS}
BEGIN
  IF v_raw IS NULL OR v_raw = '' THEN
    RETURN false;
  END IF;
  IF NOT (${bigintDigits('v_raw')}) THEN
    RAISE EXCEPTION 'fencepost.token must be decimal digits, 0 to 9223372036854775807, got %', to_json(v_raw)
      USING ERRCODE = '${INVALID_FENCE_SETTING}';
  END IF;
  v_token := v_raw::numeric::bigint;
  IF v_key IS NULL OR v_key = '' THEN
    RAISE EXCEPTION 'fencepost.token is set but fencepost.fence_key is not'
      USING ERRCODE = '${INVALID_FENCE_SETTING}', HINT = 'SET fencepost.fence_key = ''…'' or -c fencepost.fence_key=… in the startup options';
  END IF;
  IF octet_length(v_key) > 1024 OR v_key ~ '[\\x01-\\x1f\\x7f-\\x9f\\ufffd]' THEN
    RAISE EXCEPTION 'fencepost.fence_key must be at most 1024 bytes without control characters'
      USING ERRCODE = '${INVALID_FENCE_SETTING}';
  END IF;
  IF fence_key_prefixes IS NOT NULL AND NOT EXISTS (SELECT 1 FROM unnest(fence_key_prefixes) p WHERE starts_with(v_key, p)) THEN
    RAISE EXCEPTION 'key % may not write fence key %: it is outside its fence-key prefixes', writer_id, to_json(v_key)
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  SELECT f.highest_token INTO v_highest
  FROM fencepost.fence_transaction(${CAPABILITY_SECRET_SQL}, ARRAY[v_key], ARRAY[v_token], writer_id) f;
  IF v_highest IS NULL THEN
    -- A statement of its own, so it sees the fence as it is now (the raise that made us stale).
    SELECT f.highest_token INTO v_highest FROM fencepost.fences f WHERE f.fence_key = v_key;
    RAISE EXCEPTION 'stale fencing token: token % is below the highest token % of fence key %', v_token, v_highest, to_json(v_key)
      USING ERRCODE = '${STALE_TOKEN}',
            DETAIL = ${staleDetailSql('v_key', 'v_token', 'v_highest')},
            HINT = 'a newer leader holds this fence: nothing of this transaction was applied';
  END IF;
  RETURN true;
END $$`,
  },
  {
    // The token forgery guard on the SQL endpoint (src/proxy/forgery-guard.ts): a session's token
    // may raise a guarded fence only if the proxy's guard admitted that (fence key, token). `guard`
    // is the proxy's finding as JSON (sql/fence.ts guardState):
    //   {"prefixes": [guarded fence-key prefixes], "fenceKey": k, "token": "t"[, "unavailable": true]}
    // The check is on the settings as they are in this transaction, whatever the proxy saw: the
    // admitted pair passes, and so does a token that raises nothing (≤ the fence's highest, which
    // only rises); anything else fails before the transaction's first statement (FP409 "unverified
    // token", or FP503 when the guard could not reach ZooKeeper for that very pair: safe to retry).
    // Malformed settings are left to session_fence_check.
    name: 'fencepost.session_guard_check(jsonb)',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.session_guard_check(guard jsonb)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
${SESSION_SETTINGS}
BEGIN
  IF guard IS NULL OR v_raw IS NULL OR NOT (${bigintDigits('v_raw')}) OR v_key IS NULL OR v_key = '' THEN
    RETURN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(guard -> 'prefixes') p WHERE starts_with(v_key, p)) THEN
    RETURN;
  END IF;
  v_token := v_raw::numeric::bigint;
  IF guard ->> 'fenceKey' = v_key AND guard ->> 'token' = v_token::text AND NOT coalesce((guard ->> 'unavailable')::boolean, false) THEN
    RETURN;
  END IF;
  SELECT f.highest_token INTO v_highest FROM fencepost.fences f WHERE f.fence_key = v_key;
  IF v_highest IS NOT NULL AND v_token <= v_highest THEN
    RETURN;
  END IF;
  IF guard ->> 'fenceKey' = v_key AND guard ->> 'token' = v_token::text THEN
    RAISE EXCEPTION 'cannot verify fencing token % of fence key %: ZooKeeper unreachable', v_token, to_json(v_key)
      USING ERRCODE = '${GUARD_UNAVAILABLE}',
            DETAIL = ${unverifiedDetailSql('v_key', 'v_token', 'v_highest')},
            HINT = 'the forgery guard could not ask ZooKeeper whether this token is the current leader''s; nothing was applied, safe to retry';
  END IF;
  RAISE EXCEPTION 'unverified fencing token: token % would raise fence key % but is not the current leader''s', v_token, to_json(v_key)
    USING ERRCODE = '${STALE_TOKEN}',
          DETAIL = ${unverifiedDetailSql('v_key', 'v_token', 'v_highest')},
          HINT = 'the forgery guard did not verify this token as the sequence of the current leader''s election node; nothing of this transaction was applied';
END $$`,
  },
  {
    // The SQL endpoint's entry (src/proxy/sql/fence.ts), run at the start of every transaction of a
    // session. Its capability is bound to the backend, the prefixes (as array text, null in open
    // mode), the writer and the guard state, so whoever reads it in pg_stat_activity can do nothing
    // the proxy would not do for that session anyway. The leader's case (one fence at the session's
    // own token, of at most 18 digits, inside the prefixes) answers here; the forgery guard has
    // nothing to say about a transaction that raises nothing. Anything else takes the full path.
    name: 'fencepost.fence_session_bound(text, text, text, text)',
    revoke: true,
    client: true,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.fence_session_bound(session_capability text, fence_key_prefixes text, writer_id text, guard text)
RETURNS boolean
${PROXY_FUNCTION} AS $$
DECLARE
  v_raw    text := pg_catalog.current_setting('fencepost.token', true);
  v_key    text := pg_catalog.current_setting('fencepost.fence_key', true);
  v_secret text;
  v_prefix text;
  v_inside boolean;
  v_mark   text;
BEGIN
  IF v_raw ~ '^[0-9]{1,18}$' AND v_key <> '' THEN
    v_inside := fence_key_prefixes IS NULL;
    IF NOT v_inside THEN
      FOREACH v_prefix IN ARRAY fence_key_prefixes::text[] LOOP
        IF starts_with(v_key, v_prefix) THEN
          v_inside := true;
          EXIT;
        END IF;
      END LOOP;
    END IF;
    IF v_inside THEN
      -- The share step reads the secret too; a caller other than the proxy fails right after it,
      -- which rolls back its lock and count with its (sub)transaction.
      ${leaderFastPath({ secret: 'v_secret', fenceKey: 'v_key', token: 'v_raw::bigint', secretInto: 'v_secret', onShared: refuseUnlessProxy('fence_session_bound', 'session_capability', boundCapabilitySql('v_secret', ['fence_key_prefixes', 'writer_id', 'guard'])), onHeld: 'RETURN true;' })}
    END IF;
  END IF;
  v_secret := ${CAPABILITY_SECRET_SQL};
  ${refuseUnlessProxy('fence_session_bound', 'session_capability', boundCapabilitySql('v_secret', ['fence_key_prefixes', 'writer_id', 'guard']))}
  -- Every transaction of a session, with a token or not, reads the temporary sequence: no PREPARE TRANSACTION.
  ${NO_PREPARE}
  IF guard IS NOT NULL THEN
    PERFORM fencepost.session_guard_check(guard::jsonb);
  END IF;
  RETURN fencepost.session_fence_check(fence_key_prefixes::text[], writer_id);
END $$`,
  },
  {
    // The trigger of every protected table (src/fence/protect.ts), FOR EACH STATEMENT before
    // INSERT, UPDATE, DELETE and TRUNCATE (COPY FROM and MERGE fire them too): the statement goes on
    // only in a transaction that passed the fence of TG_ARGV[0] (rule.ts markFenced), whoever sends
    // it. A transaction holds the fences it passed until it ends, so no raise commits before it does.
    name: 'fencepost.refuse_unfenced_write()',
    revoke: true,
    client: false,
    sql: `
CREATE OR REPLACE FUNCTION fencepost.refuse_unfenced_write() RETURNS trigger
${PROXY_FUNCTION} AS $$
DECLARE
  v_secret text := ${CAPABILITY_SECRET_SQL};
BEGIN
  IF strpos(coalesce(current_setting('${MARK_SETTING}', true), ''), ${transactionMark('v_secret', 'TG_ARGV[0]')}) = 0 THEN
    RAISE EXCEPTION '% on %.% refused: this transaction did not pass the fence of fence key %', TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), to_json(TG_ARGV[0])
      USING ERRCODE = '${NOT_FENCED}',
            DETAIL = format('protected table %s.%s, fence key %s', quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), to_json(TG_ARGV[0])),
            HINT = format('write it through the fencepost proxy with fencepost.fence_key = %s and the leader''s fencepost.token (SQL endpoint), or with that fence key on POST /v1/transactions; nothing of this statement was applied', to_json(TG_ARGV[0]));
  END IF;
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
    // of the HTTP door calls it in its WHERE (queries.ts fencedWrite: a row trigger cannot see the
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
    // What is protected, for operators at a psql prompt and for `fencepost protect --list`.
    name: 'fencepost.protected_data',
    revoke: false,
    client: false,
    sql: `
CREATE OR REPLACE VIEW fencepost.protected_data AS
  SELECT 'table'::text AS kind, coalesce(t.relation::regclass::text, t.relation::text) AS target, t.fence_key, t.declared_at,
    EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g WHERE g.tgrelid = t.relation AND g.tgname = 'fencepost_fence' AND g.tgenabled <> 'D') AS enforced
  FROM fencepost.protected_tables t
  UNION ALL
  SELECT 'prefix', p.prefix, p.fence_key, p.declared_at,
    EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g WHERE g.tgrelid = 'fencepost.objects'::regclass AND g.tgname = 'fencepost_fence' AND g.tgenabled <> 'D')
  FROM fencepost.protected_prefixes p`,
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
  .map((d) => `${d.sql.trim()};\n${d.revoke ? `REVOKE ALL ON FUNCTION ${d.name} FROM PUBLIC;\n` : ''}`)
  .join('\n');

/** What migrate() records, to know whether the database has these definitions. */
export const DEFINITIONS_SHA256 = createHash('sha256').update(DEFINITIONS_SQL, 'utf8').digest('hex');

/** The functions the proxy calls as a client login (or a key's role): what they are granted. */
export const CLIENT_FUNCTIONS: readonly string[] = definitions.filter((d) => d.client).map((d) => d.name);
