-- The fencepost and fencepost_api schemas a fresh install leaves (PostgreSQL 18), from tools/schema-dump.ts.
-- Installs use migrate() (migrations/ and src/fence/definitions.ts), which makes exactly this; it applies to an
-- empty database too (psql -f), as the role that is to own it. Regenerate with `npm run schema:dump`.

SET check_function_bodies = false;

-- Schemas

CREATE SCHEMA fencepost;
CREATE SCHEMA fencepost_api;

-- Sequences

CREATE SEQUENCE fencepost.object_incarnations AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;
CREATE SEQUENCE fencepost.rejections_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;
CREATE SEQUENCE fencepost.session_serial AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

-- Functions

CREATE OR REPLACE FUNCTION fencepost.object_fence_ok(object_key text, fence_key text)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  v_prefix text;
  v_fence_key text;
BEGIN
  SELECT p.prefix, p.fence_key INTO v_prefix, v_fence_key FROM fencepost.protected_prefixes p
  WHERE starts_with(object_key, p.prefix) ORDER BY octet_length(p.prefix) DESC LIMIT 1;
  IF FOUND AND v_fence_key IS DISTINCT FROM object_fence_ok.fence_key THEN
    RAISE EXCEPTION 'object % is under protected prefix %: it is fenced by fence key %, not %', to_json(object_key), to_json(v_prefix), to_json(v_fence_key), to_json(object_fence_ok.fence_key)
      USING ERRCODE = 'FP403',
            DETAIL = format('protected prefix %s, fence key %s', to_json(v_prefix), to_json(v_fence_key)),
            HINT = format('send Fence-Key: %s with the leader''s token; nothing was applied', v_fence_key);
  END IF;
  RETURN true;
END $function$;
REVOKE ALL ON ROUTINE fencepost.object_fence_ok(text,text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fencepost.refuse_fence_change()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    RAISE EXCEPTION 'fence % may not go down from % to %', OLD.fence_key, OLD.highest_token, NEW.highest_token
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RAISE EXCEPTION 'fence rows are never deleted (%)', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END $function$;

CREATE OR REPLACE FUNCTION fencepost.refuse_misfenced_object()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
  PERFORM fencepost.object_fence_ok(NEW.key, NEW.fence_key);
  RETURN NEW;
END $function$;
REVOKE ALL ON ROUTINE fencepost.refuse_misfenced_object() FROM PUBLIC;

CREATE OR REPLACE FUNCTION fencepost.refuse_unfenced_write()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
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
      USING ERRCODE = 'FP403',
            DETAIL = pg_catalog.format('protected table %s.%s, fence key %s', pg_catalog.quote_ident(TG_TABLE_SCHEMA), pg_catalog.quote_ident(TG_TABLE_NAME), pg_catalog.to_json(TG_ARGV[0])),
            HINT = pg_catalog.format('write it through the fencepost proxy with fencepost.fence_key = %s and the leader''s fencepost.token in the connection''s startup options (SQL endpoint), or with that fence key on POST /v1/transactions; nothing of this statement was applied', pg_catalog.to_json(TG_ARGV[0]));
  END IF;
  v_token_now := pg_catalog.current_setting('fencepost.token', true);
  v_key_now := pg_catalog.current_setting('fencepost.fence_key', true);
  IF NOT (coalesce(v_token OPERATOR(pg_catalog.=) v_token_now, v_token IS NULL AND v_token_now IS NULL)
          AND coalesce(v_key OPERATOR(pg_catalog.=) v_key_now, v_key IS NULL AND v_key_now IS NULL)) THEN
    RAISE EXCEPTION '% on %.% refused: fencepost.token or fencepost.fence_key was changed after this connection was fenced at token % of fence key %', TG_OP, pg_catalog.quote_ident(TG_TABLE_SCHEMA), pg_catalog.quote_ident(TG_TABLE_NAME), v_token, pg_catalog.to_json(TG_ARGV[0])
      USING ERRCODE = 'FP400',
            HINT = 'a connection is fenced once, at startup: reconnect with the new token (a new pool), or RESET the settings; nothing of this statement was applied';
  END IF;
  -- The session's temporary sequence, made at its first protected write (a connect makes none).
  v_no_prepare := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
  IF v_no_prepare IS NULL THEN
    CREATE TEMPORARY SEQUENCE fencepost_no_prepare_seq;
    v_no_prepare := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
  END IF;
  PERFORM pg_catalog.pg_sequence_last_value(v_no_prepare);
  RETURN NULL;
END $function$;
REVOKE ALL ON ROUTINE fencepost.refuse_unfenced_write() FROM PUBLIC;

CREATE OR REPLACE FUNCTION fencepost.revoke_older_sessions()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
    RAISE EXCEPTION 'a fence is raised in READ COMMITTED only' USING ERRCODE = 'FP428';
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
END $function$;
REVOKE ALL ON ROUTINE fencepost.revoke_older_sessions() FROM PUBLIC;

CREATE OR REPLACE FUNCTION fencepost.trigger_problem(rel regclass, fn regprocedure, kind smallint, args bytea)
 RETURNS text
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION fencepost_api.discard_temp()
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
  IF EXISTS (SELECT FROM pg_depend d WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = pg_my_temp_schema()
             AND NOT (d.classid = 'pg_class'::regclass AND d.objid = coalesce(to_regclass('pg_temp.fencepost_no_prepare_seq'), 0))) THEN
    DISCARD TEMP;
  END IF;
END $function$;
REVOKE ALL ON ROUTINE fencepost_api.discard_temp() FROM PUBLIC;

CREATE OR REPLACE FUNCTION fencepost_api.fence_session(session_capability text, fence_key text, token bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  v_secret text := (SELECT c.secret FROM fencepost.fence_capability c);
  v_highest bigint;
  v_serial bigint;
BEGIN
  -- Sizes first: nothing of an oversized call is hashed, read or locked.
  IF octet_length(session_capability) > 64 OR octet_length(fence_key) > 1024 THEN
    RAISE EXCEPTION 'fencepost_api.fence_session: argument too long (capability % bytes, fence key % bytes; at most 64 and 1024)', octet_length(session_capability), octet_length(fence_key)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF session_capability IS DISTINCT FROM encode(sha256(convert_to('fencepost bound capability v2' || '|' || v_secret || '|' || pg_backend_pid() || '|' || (SELECT pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS') FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a) || '|' || coalesce('fence_session', 'NULL') || '|' || coalesce(fence_key, 'NULL') || '|' || coalesce(token::text, 'NULL') || '|' || v_secret, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'fencepost.fence_session may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
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
  VALUES (pg_backend_pid(), fence_session.fence_key, (SELECT a.backend_start FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a), v_serial, token,
          current_setting('fencepost.token', true), current_setting('fencepost.fence_key', true));
  RETURN v_highest;
END $function$;
REVOKE ALL ON ROUTINE fencepost_api.fence_session(text,text,bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fencepost_api.session_start()
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
  IF to_regclass('pg_temp.fencepost_no_prepare_seq') IS NULL THEN
    CREATE TEMPORARY SEQUENCE fencepost_no_prepare_seq;
    GRANT SELECT ON SEQUENCE pg_temp.fencepost_no_prepare_seq TO PUBLIC;
  END IF;
  RETURN (SELECT pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS') FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a);
END $function$;
REVOKE ALL ON ROUTINE fencepost_api.session_start() FROM PUBLIC;

-- Tables

CREATE TABLE fencepost.client_logins (
  login text NOT NULL,
  password text NOT NULL,
  created_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT client_logins_pkey PRIMARY KEY (login)
);

CREATE TABLE fencepost.definitions (
  only_row boolean NOT NULL DEFAULT true,
  version integer NOT NULL,
  sha256 text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT definitions_only_row_check CHECK (only_row),
  CONSTRAINT definitions_pkey PRIMARY KEY (only_row)
);

CREATE TABLE fencepost.fence_capability (
  only_row boolean NOT NULL DEFAULT true,
  secret text NOT NULL,
  CONSTRAINT fence_capability_only_row_check CHECK (only_row),
  CONSTRAINT fence_capability_pkey PRIMARY KEY (only_row)
);

CREATE TABLE fencepost.fence_counts (
  fence_key text NOT NULL,
  shard smallint NOT NULL,
  accepted bigint NOT NULL DEFAULT 0,
  rejected bigint NOT NULL DEFAULT 0,
  CONSTRAINT fence_counts_pkey PRIMARY KEY (fence_key, shard)
);

CREATE UNLOGGED TABLE fencepost.fenced_backends (
  pid integer NOT NULL,
  fence_key text NOT NULL,
  backend_start timestamp with time zone NOT NULL,
  serial bigint NOT NULL,
  token bigint NOT NULL,
  token_setting text,
  fence_key_setting text,
  fenced_at timestamp with time zone NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT fenced_backends_pkey PRIMARY KEY (pid, fence_key)
);

CREATE TABLE fencepost.fences (
  fence_key text NOT NULL,
  highest_token bigint NOT NULL,
  created_at timestamp with time zone NOT NULL DEFAULT now(),
  updated_at timestamp with time zone NOT NULL DEFAULT now(),
  raised_by text,
  CONSTRAINT fences_highest_token_check CHECK ((highest_token >= 0)),
  CONSTRAINT fences_pkey PRIMARY KEY (fence_key)
);

CREATE TABLE fencepost.migrations (
  id integer NOT NULL,
  name text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT migrations_pkey PRIMARY KEY (id)
);

CREATE TABLE fencepost.objects (
  key text NOT NULL,
  fence_key text NOT NULL,
  token bigint NOT NULL,
  version bigint NOT NULL,
  content_type text NOT NULL,
  body bytea NOT NULL,
  updated_at timestamp with time zone NOT NULL DEFAULT now(),
  incarnation bigint NOT NULL DEFAULT nextval('fencepost.object_incarnations'::regclass),
  CONSTRAINT objects_pkey PRIMARY KEY (key)
);

CREATE TABLE fencepost.pending_counts (
  fence_key text NOT NULL
);

CREATE TABLE fencepost.protected_prefixes (
  prefix text NOT NULL,
  fence_key text NOT NULL,
  declared_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT protected_prefixes_fence_key CHECK (((octet_length(fence_key) >= 1) AND (octet_length(fence_key) <= 1024))),
  CONSTRAINT protected_prefixes_pkey PRIMARY KEY (prefix),
  CONSTRAINT protected_prefixes_prefix CHECK ((prefix <> ''::text))
);

CREATE TABLE fencepost.protected_tables (
  relation oid NOT NULL,
  fence_key text NOT NULL,
  declared_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT protected_tables_fence_key CHECK (((octet_length(fence_key) >= 1) AND (octet_length(fence_key) <= 1024))),
  CONSTRAINT protected_tables_pkey PRIMARY KEY (relation)
);

CREATE TABLE fencepost.rejection_minutes (
  minute timestamp with time zone NOT NULL,
  shard smallint NOT NULL,
  count bigint NOT NULL DEFAULT 0,
  CONSTRAINT rejection_minutes_pkey PRIMARY KEY (minute, shard)
);

CREATE TABLE fencepost.rejections (
  id bigint NOT NULL DEFAULT nextval('fencepost.rejections_id_seq'::regclass),
  fence_key text NOT NULL,
  object_key text,
  operation text NOT NULL,
  token bigint NOT NULL,
  highest_token bigint NOT NULL,
  writer_id text,
  rejected_at timestamp with time zone NOT NULL DEFAULT now(),
  door text NOT NULL DEFAULT 'http'::text,
  CONSTRAINT rejections_door CHECK ((door = ANY (ARRAY['http'::text, 'transaction'::text, 'sql'::text]))),
  CONSTRAINT rejections_pkey PRIMARY KEY (id)
);

CREATE TABLE fencepost.totals (
  shard smallint NOT NULL,
  fences bigint NOT NULL DEFAULT 0,
  accepted bigint NOT NULL DEFAULT 0,
  rejected bigint NOT NULL DEFAULT 0,
  CONSTRAINT totals_pkey PRIMARY KEY (shard)
);

-- Views

CREATE VIEW fencepost.fence_stats AS
 SELECT f.fence_key,
    f.highest_token,
    f.created_at,
    f.updated_at,
    (COALESCE(sum(c.accepted), 0::numeric) + COALESCE(max(p.n), 0::bigint)::numeric)::bigint AS accepted,
    COALESCE(sum(c.rejected), 0::numeric)::bigint AS rejected,
    f.raised_by
   FROM fencepost.fences f
     LEFT JOIN fencepost.fence_counts c USING (fence_key)
     LEFT JOIN ( SELECT s.fence_key,
            count(*) AS n
           FROM fencepost.pending_counts s
          GROUP BY s.fence_key) p USING (fence_key)
  GROUP BY f.fence_key;

CREATE VIEW fencepost.protected_data AS
 SELECT kind,
    target,
    fence_key,
    declared_at,
    why_not IS NULL AS enforced,
    why_not
   FROM ( SELECT 'table'::text AS kind,
            COALESCE(t.relation::regclass::text, t.relation::text) AS target,
            t.fence_key,
            t.declared_at,
            fencepost.trigger_problem(t.relation::regclass, 'fencepost.refuse_unfenced_write()'::regprocedure, 62::smallint, convert_to(t.fence_key, 'UTF8'::name) || '\x00'::bytea) AS why_not
           FROM fencepost.protected_tables t
        UNION ALL
         SELECT 'prefix'::text AS kind,
            p.prefix AS target,
            p.fence_key,
            p.declared_at,
            fencepost.trigger_problem('fencepost.objects'::regclass, 'fencepost.refuse_misfenced_object()'::regprocedure, 23::smallint, '\x'::bytea) AS trigger_problem
           FROM fencepost.protected_prefixes p) d;

-- Foreign keys, indexes (those no constraint makes), triggers, sequence ownership

CREATE INDEX fenced_backends_key ON fencepost.fenced_backends USING btree (fence_key, token);
CREATE INDEX fences_key_bytes ON fencepost.fences USING btree (fence_key COLLATE "C");
CREATE INDEX fences_updated_at ON fencepost.fences USING btree (updated_at DESC);
CREATE INDEX objects_key_bytes ON fencepost.objects USING btree (key COLLATE "C");
CREATE INDEX rejections_fence_key_id ON fencepost.rejections USING btree (fence_key, id DESC);
CREATE INDEX rejections_fence_key_time ON fencepost.rejections USING btree (fence_key, rejected_at);
CREATE INDEX rejections_rejected_at ON fencepost.rejections USING btree (rejected_at);
CREATE TRIGGER fences_never_deleted BEFORE DELETE ON fencepost.fences FOR EACH ROW EXECUTE FUNCTION fencepost.refuse_fence_change();
CREATE TRIGGER fences_never_lower BEFORE UPDATE ON fencepost.fences FOR EACH ROW WHEN (((new.highest_token < old.highest_token) OR (new.fence_key <> old.fence_key))) EXECUTE FUNCTION fencepost.refuse_fence_change();
CREATE TRIGGER fences_never_truncated BEFORE TRUNCATE ON fencepost.fences FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_fence_change();
CREATE TRIGGER fences_revoke_older AFTER UPDATE OF highest_token ON fencepost.fences FOR EACH ROW WHEN ((new.highest_token > old.highest_token)) EXECUTE FUNCTION fencepost.revoke_older_sessions();
ALTER SEQUENCE fencepost.rejections_id_seq OWNED BY fencepost.rejections.id;
