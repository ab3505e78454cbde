-- The fencepost schema a fresh install leaves (PostgreSQL 18), from tools/schema-dump.ts.
-- Not applied by anything: migrations/ and src/fence/definitions.ts make it. Regenerate with `npm run schema:dump`.

-- schema fencepost: privileges {<owner>=UC/<owner>}

CREATE TABLE fencepost.client_logins (
  login text NOT NULL,
  password text NOT NULL,
  created_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT client_logins_pkey PRIMARY KEY (login)
);
CREATE UNIQUE INDEX client_logins_pkey ON fencepost.client_logins USING btree (login);
-- fencepost.client_logins: privileges {<owner>=arwdDxtm/<owner>}

CREATE TABLE fencepost.definitions (
  only_row boolean NOT NULL DEFAULT true,
  version integer NOT NULL,
  sha256 text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT definitions_only_row_check CHECK (only_row),
  CONSTRAINT definitions_pkey PRIMARY KEY (only_row)
);
CREATE UNIQUE INDEX definitions_pkey ON fencepost.definitions USING btree (only_row);
-- fencepost.definitions: privileges {<owner>=arwdDxtm/<owner>}

CREATE TABLE fencepost.fence_capability (
  only_row boolean NOT NULL DEFAULT true,
  secret text NOT NULL,
  CONSTRAINT fence_capability_only_row_check CHECK (only_row),
  CONSTRAINT fence_capability_pkey PRIMARY KEY (only_row)
);
CREATE UNIQUE INDEX fence_capability_pkey ON fencepost.fence_capability USING btree (only_row);
-- fencepost.fence_capability: privileges {<owner>=arwdDxtm/<owner>}

CREATE TABLE fencepost.fence_counts (
  fence_key text NOT NULL,
  shard smallint NOT NULL,
  accepted bigint NOT NULL DEFAULT 0,
  rejected bigint NOT NULL DEFAULT 0,
  CONSTRAINT fence_counts_pkey PRIMARY KEY (fence_key, shard)
);
CREATE UNIQUE INDEX fence_counts_pkey ON fencepost.fence_counts USING btree (fence_key, shard);
-- fencepost.fence_counts: privileges {<owner>=arwdDxtm/<owner>}

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
-- fencepost.fence_stats: privileges {<owner>=arwdDxtm/<owner>}

CREATE TABLE fencepost.fences (
  fence_key text NOT NULL,
  highest_token bigint NOT NULL,
  created_at timestamp with time zone NOT NULL DEFAULT now(),
  updated_at timestamp with time zone NOT NULL DEFAULT now(),
  raised_by text,
  CONSTRAINT fences_highest_token_check CHECK ((highest_token >= 0)),
  CONSTRAINT fences_pkey PRIMARY KEY (fence_key)
);
CREATE INDEX fences_key_bytes ON fencepost.fences USING btree (fence_key COLLATE "C");
CREATE UNIQUE INDEX fences_pkey ON fencepost.fences USING btree (fence_key);
CREATE INDEX fences_updated_at ON fencepost.fences USING btree (updated_at DESC);
CREATE TRIGGER fences_never_deleted BEFORE DELETE ON fencepost.fences FOR EACH ROW EXECUTE FUNCTION fencepost.refuse_fence_change();
CREATE TRIGGER fences_never_lower BEFORE UPDATE ON fencepost.fences FOR EACH ROW WHEN (((new.highest_token < old.highest_token) OR (new.fence_key <> old.fence_key))) EXECUTE FUNCTION fencepost.refuse_fence_change();
CREATE TRIGGER fences_never_truncated BEFORE TRUNCATE ON fencepost.fences FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_fence_change();
-- fencepost.fences: privileges {<owner>=arwdDxtm/<owner>}

CREATE TABLE fencepost.migrations (
  id integer NOT NULL,
  name text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT migrations_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX migrations_pkey ON fencepost.migrations USING btree (id);
-- fencepost.migrations: privileges {<owner>=arwdDxtm/<owner>}

CREATE SEQUENCE fencepost.object_incarnations AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807;
-- fencepost.object_incarnations: privileges {<owner>=rwU/<owner>}

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
CREATE INDEX objects_key_bytes ON fencepost.objects USING btree (key COLLATE "C");
CREATE UNIQUE INDEX objects_pkey ON fencepost.objects USING btree (key);
-- fencepost.objects: privileges {<owner>=arwdDxtm/<owner>}

CREATE TABLE fencepost.pending_counts (
  fence_key text NOT NULL
);
-- fencepost.pending_counts: privileges {<owner>=arwdDxtm/<owner>}

CREATE VIEW fencepost.protected_data AS
 SELECT 'table'::text AS kind,
    COALESCE(t.relation::regclass::text, t.relation::text) AS target,
    t.fence_key,
    t.declared_at,
    (EXISTS ( SELECT 1
           FROM pg_trigger g
          WHERE g.tgrelid = t.relation AND g.tgname = 'fencepost_fence'::name AND g.tgenabled <> 'D'::"char")) AS enforced
   FROM fencepost.protected_tables t
UNION ALL
 SELECT 'prefix'::text AS kind,
    p.prefix AS target,
    p.fence_key,
    p.declared_at,
    (EXISTS ( SELECT 1
           FROM pg_trigger g
          WHERE g.tgrelid = 'fencepost.objects'::regclass::oid AND g.tgname = 'fencepost_fence'::name AND g.tgenabled <> 'D'::"char")) AS enforced
   FROM fencepost.protected_prefixes p;
-- fencepost.protected_data: privileges (default)

CREATE TABLE fencepost.protected_prefixes (
  prefix text NOT NULL,
  fence_key text NOT NULL,
  declared_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT protected_prefixes_fence_key CHECK (((octet_length(fence_key) >= 1) AND (octet_length(fence_key) <= 1024))),
  CONSTRAINT protected_prefixes_pkey PRIMARY KEY (prefix),
  CONSTRAINT protected_prefixes_prefix CHECK ((prefix <> ''::text))
);
CREATE UNIQUE INDEX protected_prefixes_pkey ON fencepost.protected_prefixes USING btree (prefix);
-- fencepost.protected_prefixes: privileges (default)

CREATE TABLE fencepost.protected_tables (
  relation oid NOT NULL,
  fence_key text NOT NULL,
  declared_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT protected_tables_fence_key CHECK (((octet_length(fence_key) >= 1) AND (octet_length(fence_key) <= 1024))),
  CONSTRAINT protected_tables_pkey PRIMARY KEY (relation)
);
CREATE UNIQUE INDEX protected_tables_pkey ON fencepost.protected_tables USING btree (relation);
-- fencepost.protected_tables: privileges (default)

CREATE TABLE fencepost.rejection_minutes (
  minute timestamp with time zone NOT NULL,
  shard smallint NOT NULL,
  count bigint NOT NULL DEFAULT 0,
  CONSTRAINT rejection_minutes_pkey PRIMARY KEY (minute, shard)
);
CREATE UNIQUE INDEX rejection_minutes_pkey ON fencepost.rejection_minutes USING btree (minute, shard);
-- fencepost.rejection_minutes: privileges {<owner>=arwdDxtm/<owner>}

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
CREATE INDEX rejections_fence_key_id ON fencepost.rejections USING btree (fence_key, id DESC);
CREATE INDEX rejections_fence_key_time ON fencepost.rejections USING btree (fence_key, rejected_at);
CREATE UNIQUE INDEX rejections_pkey ON fencepost.rejections USING btree (id);
CREATE INDEX rejections_rejected_at ON fencepost.rejections USING btree (rejected_at);
-- fencepost.rejections: privileges {<owner>=arwdDxtm/<owner>}

CREATE SEQUENCE fencepost.rejections_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807;
-- fencepost.rejections_id_seq: privileges {<owner>=rwU/<owner>}

CREATE TABLE fencepost.totals (
  shard smallint NOT NULL,
  fences bigint NOT NULL DEFAULT 0,
  accepted bigint NOT NULL DEFAULT 0,
  rejected bigint NOT NULL DEFAULT 0,
  CONSTRAINT totals_pkey PRIMARY KEY (shard)
);
CREATE UNIQUE INDEX totals_pkey ON fencepost.totals USING btree (shard);
-- fencepost.totals: privileges {<owner>=arwdDxtm/<owner>}

CREATE OR REPLACE FUNCTION fencepost.discard_temp()
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
-- fencepost.discard_temp(): privileges {<owner>=X/<owner>}

CREATE OR REPLACE FUNCTION fencepost.fence_session_bound(session_capability text, fence_key_prefixes text, writer_id text, guard text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
      INSERT INTO fencepost.pending_counts (fence_key)
    SELECT f.fence_key FROM fencepost.fences f WHERE f.fence_key = v_key AND f.highest_token = v_raw::bigint FOR SHARE OF f
    RETURNING (SELECT c.secret FROM fencepost.fence_capability c) INTO v_secret;
  IF FOUND THEN
    IF session_capability IS DISTINCT FROM encode(sha256(convert_to(v_secret || '|' || pg_backend_pid() || '|' || coalesce(fence_key_prefixes, 'NULL') || '|' || coalesce(writer_id, 'NULL') || '|' || coalesce(guard, 'NULL') || '|' || v_secret, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'fencepost.fence_session_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
    DECLARE
      v_no_prepare regclass := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
    BEGIN
      IF v_no_prepare IS NULL THEN
        CREATE TEMPORARY SEQUENCE fencepost_no_prepare_seq;
        v_no_prepare := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
      END IF;
      IF pg_catalog.pg_sequence_last_value(v_no_prepare) IS NOT NULL THEN
        NULL;
      END IF;
    END;
    v_mark := pg_catalog.set_config('fencepost.fenced', coalesce(pg_catalog.current_setting('fencepost.fenced', true), '') || encode(sha256(convert_to(v_secret || '|' || txid_current()::text || '|' || v_key || '|' || v_secret, 'UTF8')), 'hex'), true);
    RETURN true;
  END IF;
    END IF;
  END IF;
  v_secret := (SELECT c.secret FROM fencepost.fence_capability c);
  IF session_capability IS DISTINCT FROM encode(sha256(convert_to(v_secret || '|' || pg_backend_pid() || '|' || coalesce(fence_key_prefixes, 'NULL') || '|' || coalesce(writer_id, 'NULL') || '|' || coalesce(guard, 'NULL') || '|' || v_secret, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'fencepost.fence_session_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  -- Every transaction of a session, with a token or not, reads the temporary sequence: no PREPARE TRANSACTION.
  DECLARE
      v_no_prepare regclass := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
    BEGIN
      IF v_no_prepare IS NULL THEN
        CREATE TEMPORARY SEQUENCE fencepost_no_prepare_seq;
        v_no_prepare := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
      END IF;
      IF pg_catalog.pg_sequence_last_value(v_no_prepare) IS NOT NULL THEN
        NULL;
      END IF;
    END;
  IF guard IS NOT NULL THEN
    PERFORM fencepost.session_guard_check(guard::jsonb);
  END IF;
  RETURN fencepost.session_fence_check(fence_key_prefixes::text[], writer_id);
END $function$;
-- fencepost.fence_session_bound(text,text,text,text): privileges {<owner>=X/<owner>}

CREATE OR REPLACE FUNCTION fencepost.fence_transaction(capability text, fence_keys text[], tokens bigint[], writer_id text)
 RETURNS TABLE(ord integer, highest_token bigint, xact bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
  r record;
  v_ords int[] := '{}';
  v_highest bigint[] := '{}';
  v_raise text[] := '{}';
  v_stale boolean := false;
BEGIN
  IF capability IS DISTINCT FROM (SELECT c.secret FROM fencepost.fence_capability c) THEN
    RAISE EXCEPTION 'fencepost.fence_transaction may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  FOR r IN
    WITH input AS (
      SELECT (t.n - 1)::int AS ord, t.fence_key, t.token FROM unnest(fence_keys, tokens) WITH ORDINALITY AS t(fence_key, token, n)
    ),
    held AS (
      SELECT f.fence_key, f.highest_token FROM fencepost.fences f JOIN input k ON k.fence_key = f.fence_key AND f.highest_token >= k.token
  ORDER BY f.fence_key COLLATE "C"
  FOR SHARE OF f
    )
    SELECT i.ord AS o, i.fence_key AS k, i.token AS t, h.highest_token AS h
    FROM input i LEFT JOIN held h ON h.fence_key = i.fence_key
    ORDER BY i.ord
  LOOP
    IF r.h IS NULL THEN
      v_raise := v_raise || format('%s to %s', to_json(r.k), r.t);
    ELSIF r.h = r.t THEN
      PERFORM pg_catalog.set_config('fencepost.fenced', coalesce(pg_catalog.current_setting('fencepost.fenced', true), '') || encode(sha256(convert_to(capability || '|' || txid_current()::text || '|' || r.k || '|' || capability, 'UTF8')), 'hex'), true);
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
      USING ERRCODE = 'FP428',
            HINT = 'the proxy raises a fence in a transaction of its own, then starts the transaction again; nothing of this transaction was applied';
  END IF;
  INSERT INTO fencepost.pending_counts (fence_key) SELECT DISTINCT k FROM unnest(fence_keys) AS k;
  RETURN QUERY SELECT o, h, txid_current() FROM unnest(v_ords, v_highest) AS x(o, h);
END $function$;
-- fencepost.fence_transaction(text,text[],bigint[],text): privileges {<owner>=X/<owner>}

CREATE OR REPLACE FUNCTION fencepost.fence_transaction_bound(transaction_capability text, fence_keys_hex text, tokens text, writer_id_hex text)
 RETURNS TABLE(ord integer, highest_token bigint, xact bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
  v_secret text := (SELECT c.secret FROM fencepost.fence_capability c);
  v_key    text;
  v_mark   text;
BEGIN
  IF transaction_capability IS DISTINCT FROM encode(sha256(convert_to(v_secret || '|' || pg_backend_pid() || '|' || coalesce(fence_keys_hex, 'NULL') || '|' || coalesce(tokens, 'NULL') || '|' || coalesce(writer_id_hex, 'NULL') || '|' || v_secret, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'fencepost.fence_transaction_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF NOT starts_with(current_query(), 'BEGIN; RESET ALL; SET SESSION AUTHORIZATION DEFAULT; ') THEN
    RAISE EXCEPTION 'fencepost.fence_transaction_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF strpos(fence_keys_hex, ',') = 0 AND tokens ~ '^[0-9]{1,18}$' THEN
    v_key := convert_from(decode(fence_keys_hex, 'hex'), 'UTF8');
    INSERT INTO fencepost.pending_counts (fence_key)
    SELECT f.fence_key FROM fencepost.fences f WHERE f.fence_key = v_key AND f.highest_token = tokens::bigint FOR SHARE OF f;
  IF FOUND THEN
    
    DECLARE
      v_no_prepare regclass := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
    BEGIN
      IF v_no_prepare IS NULL THEN
        CREATE TEMPORARY SEQUENCE fencepost_no_prepare_seq;
        v_no_prepare := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
      END IF;
      IF pg_catalog.pg_sequence_last_value(v_no_prepare) IS NOT NULL THEN
        NULL;
      END IF;
    END;
    v_mark := pg_catalog.set_config('fencepost.fenced', coalesce(pg_catalog.current_setting('fencepost.fenced', true), '') || encode(sha256(convert_to(v_secret || '|' || txid_current()::text || '|' || v_key || '|' || v_secret, 'UTF8')), 'hex'), true);
    RETURN QUERY SELECT 0, tokens::bigint, txid_current();
    RETURN;
  END IF;
  END IF;
  -- Every fenced transaction reads the temporary sequence: no PREPARE TRANSACTION.
  DECLARE
      v_no_prepare regclass := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
    BEGIN
      IF v_no_prepare IS NULL THEN
        CREATE TEMPORARY SEQUENCE fencepost_no_prepare_seq;
        v_no_prepare := pg_catalog.to_regclass('pg_temp.fencepost_no_prepare_seq');
      END IF;
      IF pg_catalog.pg_sequence_last_value(v_no_prepare) IS NOT NULL THEN
        NULL;
      END IF;
    END;
  RETURN QUERY SELECT f.ord, f.highest_token, f.xact FROM fencepost.fence_transaction(v_secret,
    ARRAY(SELECT convert_from(decode(h, 'hex'), 'UTF8') FROM unnest(string_to_array(fence_keys_hex, ',')) WITH ORDINALITY AS t(h, n) ORDER BY t.n),
    string_to_array(tokens, ',')::bigint[],
    convert_from(decode(writer_id_hex, 'hex'), 'UTF8')) f;
END $function$;
-- fencepost.fence_transaction_bound(text,text,text,text): privileges {<owner>=X/<owner>}

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
-- fencepost.object_fence_ok(text,text): privileges {<owner>=X/<owner>}

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
-- fencepost.refuse_fence_change(): privileges (default)

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
-- fencepost.refuse_misfenced_object(): privileges {<owner>=X/<owner>}

CREATE OR REPLACE FUNCTION fencepost.refuse_unfenced_write()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  v_secret text := (SELECT c.secret FROM fencepost.fence_capability c);
BEGIN
  IF strpos(coalesce(current_setting('fencepost.fenced', true), ''), encode(sha256(convert_to(v_secret || '|' || txid_current()::text || '|' || TG_ARGV[0] || '|' || v_secret, 'UTF8')), 'hex')) = 0 THEN
    RAISE EXCEPTION '% on %.% refused: this transaction did not pass the fence of fence key %', TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), to_json(TG_ARGV[0])
      USING ERRCODE = 'FP403',
            DETAIL = format('protected table %s.%s, fence key %s', quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), to_json(TG_ARGV[0])),
            HINT = format('write it through the fencepost proxy with fencepost.fence_key = %s and the leader''s fencepost.token (SQL endpoint), or with that fence key on POST /v1/transactions; nothing of this statement was applied', to_json(TG_ARGV[0]));
  END IF;
  RETURN NULL;
END $function$;
-- fencepost.refuse_unfenced_write(): privileges {<owner>=X/<owner>}

CREATE OR REPLACE FUNCTION fencepost.seal_client_transaction(fenced_xact bigint)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
  IF txid_current() IS DISTINCT FROM fenced_xact THEN
    RAISE EXCEPTION 'a statement ended the fenced transaction'
      USING ERRCODE = 'FP410';
  END IF;
  PERFORM set_config('synchronous_commit', 'on', true);
END $function$;
-- fencepost.seal_client_transaction(bigint): privileges {<owner>=X/<owner>}

CREATE OR REPLACE FUNCTION fencepost.session_fence_check(fence_key_prefixes text[], writer_id text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  v_raw   text := current_setting('fencepost.token', true);
  v_key   text := current_setting('fencepost.fence_key', true);
  v_token bigint;
  v_highest bigint;
BEGIN
  IF v_raw IS NULL OR v_raw = '' THEN
    RETURN false;
  END IF;
  IF NOT (v_raw ~ '^[0-9]+$' AND ltrim(v_raw, '0') ~ '^[0-9]{0,19}$' AND v_raw::numeric <= 9223372036854775807) THEN
    RAISE EXCEPTION 'fencepost.token must be decimal digits, 0 to 9223372036854775807, got %', to_json(v_raw)
      USING ERRCODE = 'FP400';
  END IF;
  v_token := v_raw::numeric::bigint;
  IF v_key IS NULL OR v_key = '' THEN
    RAISE EXCEPTION 'fencepost.token is set but fencepost.fence_key is not'
      USING ERRCODE = 'FP400', HINT = 'SET fencepost.fence_key = ''…'' or -c fencepost.fence_key=… in the startup options';
  END IF;
  IF octet_length(v_key) > 1024 OR v_key ~ '[\x01-\x1f\x7f-\x9f\ufffd]' THEN
    RAISE EXCEPTION 'fencepost.fence_key must be at most 1024 bytes without control characters'
      USING ERRCODE = 'FP400';
  END IF;
  IF fence_key_prefixes IS NOT NULL AND NOT EXISTS (SELECT 1 FROM unnest(fence_key_prefixes) p WHERE starts_with(v_key, p)) THEN
    RAISE EXCEPTION 'key % may not write fence key %: it is outside its fence-key prefixes', writer_id, to_json(v_key)
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  SELECT f.highest_token INTO v_highest
  FROM fencepost.fence_transaction((SELECT c.secret FROM fencepost.fence_capability c), ARRAY[v_key], ARRAY[v_token], writer_id) f;
  IF v_highest IS NULL THEN
    -- A statement of its own, so it sees the fence as it is now (the raise that made us stale).
    SELECT f.highest_token INTO v_highest FROM fencepost.fences f WHERE f.fence_key = v_key;
    RAISE EXCEPTION 'stale fencing token: token % is below the highest token % of fence key %', v_token, v_highest, to_json(v_key)
      USING ERRCODE = 'FP409',
            DETAIL = format('fence key %s, token %s, highest token %s', to_json(v_key), v_token, v_highest),
            HINT = 'a newer leader holds this fence: nothing of this transaction was applied';
  END IF;
  RETURN true;
END $function$;
-- fencepost.session_fence_check(text[],text): privileges {<owner>=X/<owner>}

CREATE OR REPLACE FUNCTION fencepost.session_guard_check(guard jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  v_raw   text := current_setting('fencepost.token', true);
  v_key   text := current_setting('fencepost.fence_key', true);
  v_token bigint;
  v_highest bigint;
BEGIN
  IF guard IS NULL OR v_raw IS NULL OR NOT (v_raw ~ '^[0-9]+$' AND ltrim(v_raw, '0') ~ '^[0-9]{0,19}$' AND v_raw::numeric <= 9223372036854775807) OR v_key IS NULL OR v_key = '' THEN
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
      USING ERRCODE = 'FP503',
            DETAIL = format('unverified token: fence key %s, token %s, highest token %s', to_json(v_key), v_token, v_highest),
            HINT = 'the forgery guard could not ask ZooKeeper whether this token is the current leader''s; nothing was applied, safe to retry';
  END IF;
  RAISE EXCEPTION 'unverified fencing token: token % would raise fence key % but is not the current leader''s', v_token, to_json(v_key)
    USING ERRCODE = 'FP409',
          DETAIL = format('unverified token: fence key %s, token %s, highest token %s', to_json(v_key), v_token, v_highest),
          HINT = 'the forgery guard did not verify this token as the sequence of the current leader''s election node; nothing of this transaction was applied';
END $function$;
-- fencepost.session_guard_check(jsonb): privileges {<owner>=X/<owner>}
