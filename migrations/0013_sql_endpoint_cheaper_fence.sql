-- A cheaper fence for SQL-endpoint transactions (a leader's transaction cost its backend about
-- four times a direct one):
-- - Counted without a trigger at COMMIT. Migration 0009 counted each fenced transaction with a
--   deferred constraint trigger (two counter upserts and a delete in every transaction). The fence
--   still records one row per fenced transaction in session_commits (and, since 0012, so does
--   fence_transaction for POST /v1/transactions), in the writer's transaction, so the row exists
--   exactly when that transaction committed; the proxy folds the rows into fence_counts and totals
--   (queries.ts foldSessionCommits: deleted and counted in one statement, so each is counted once)
--   before every read of the counts and once a second. The table is now logged (a crash of Postgres
--   loses no committed count) and has no key or index to maintain. fence_stats adds the rows not
--   folded yet. A writer that makes its transaction read-only after writing is now counted when it
--   commits (the trigger could not write there, and skipped it).
-- - session_fence_check() takes the fence row FOR SHARE itself when the session's token is the
--   fence's (fence_transaction's fast path, migration 0012); other cases call fence_transaction().
-- - The guard check runs only when a guard is configured.
DROP TRIGGER session_commits_count ON fencepost.session_commits;
DROP FUNCTION fencepost.count_session_commit();
ALTER TABLE fencepost.session_commits DROP COLUMN id;
ALTER TABLE fencepost.session_commits SET LOGGED;

CREATE OR REPLACE FUNCTION fencepost.session_fence_check(fence_key_prefixes text[], writer_id text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_raw   text := current_setting('fencepost.token', true);
  v_key   text := current_setting('fencepost.fence_key', true);
  v_token bigint;
  v_highest bigint;
BEGIN
  IF v_raw IS NULL OR v_raw = '' THEN
    RETURN false;
  END IF;
  IF v_raw !~ '^[0-9]+$' OR ltrim(v_raw, '0') !~ '^[0-9]{0,19}$' OR v_raw::numeric > 9223372036854775807 THEN
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
  -- The leader's case: the fence at this very token, taken FOR SHARE (fence_transaction's fast
  -- path, here without its call). Anything else (a raise, a new fence, a stale token) goes there.
  SELECT f.highest_token INTO v_highest FROM fencepost.fences f
  WHERE f.fence_key = v_key AND f.highest_token = v_token
  FOR SHARE OF f;
  IF FOUND THEN
    INSERT INTO fencepost.session_commits (fence_key) VALUES (v_key);
    RETURN true;
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
  -- fence_transaction() recorded the transaction for its count (migration 0012).
  RETURN true;
END $$;
REVOKE ALL ON FUNCTION fencepost.session_fence_check(text[], text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fencepost.fence_session(capability text, fence_key_prefixes text[], writer_id text, guard text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF capability IS DISTINCT FROM (SELECT c.secret FROM fencepost.fence_capability c) THEN
    RAISE EXCEPTION 'fencepost.fence_session may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF guard IS NOT NULL THEN
    PERFORM fencepost.session_guard_check(guard::jsonb);
  END IF;
  RETURN fencepost.session_fence_check(fence_key_prefixes, writer_id);
END $$;
REVOKE ALL ON FUNCTION fencepost.fence_session(text, text[], text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fencepost.fence_session_bound(session_capability text, fence_key_prefixes text, writer_id text, guard text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_secret text := (SELECT c.secret FROM fencepost.fence_capability c);
BEGIN
  IF session_capability IS DISTINCT FROM encode(sha256(convert_to(
       v_secret || '|' || pg_backend_pid() || '|' || coalesce(fence_key_prefixes, 'NULL') || '|' || writer_id || '|' || coalesce(guard, 'NULL') || '|' || v_secret, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'fencepost.fence_session_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF guard IS NOT NULL THEN
    PERFORM fencepost.session_guard_check(guard::jsonb);
  END IF;
  RETURN fencepost.session_fence_check(fence_key_prefixes::text[], writer_id);
END $$;
REVOKE ALL ON FUNCTION fencepost.fence_session_bound(text, text, text, text) FROM PUBLIC;

-- Per-fence counts including the transactions committed but not folded yet.
CREATE OR REPLACE VIEW fencepost.fence_stats AS
  SELECT f.fence_key, f.highest_token, f.created_at, f.updated_at,
    (coalesce(sum(c.accepted), 0) + coalesce(max(p.n), 0))::bigint AS accepted, coalesce(sum(c.rejected), 0)::bigint AS rejected,
    f.raised_by
  FROM fencepost.fences f
  LEFT JOIN fencepost.fence_counts c USING (fence_key)
  LEFT JOIN (SELECT s.fence_key, count(*) AS n FROM fencepost.session_commits s GROUP BY s.fence_key) p USING (fence_key)
  GROUP BY f.fence_key;
