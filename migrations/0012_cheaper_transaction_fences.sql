-- Cheaper fences for transactions (POST /v1/transactions and the SQL endpoint). A leader's SQL
-- transaction cost its backend about four times a direct one.
-- - fence_transaction(): one fence at its own token takes the fence row FOR SHARE in a statement
--   of its own and returns, without planning the general statement's CTEs. Raises, new fences,
--   stale tokens and several fences take the general path, unchanged (the lock protocol of
--   fencedWrite: share for the fence's own token, exclusive to raise). session_fence_check()
--   does the same itself for an SQL session at its fence's token.
-- - Counted by a row, not by a trigger or a statement after COMMIT. Migration 0009 counted each
--   SQL transaction with a deferred constraint trigger (two counter upserts and a delete in every
--   transaction); POST /v1/transactions counted with a statement after COMMIT. Now the fence
--   inserts one row per fence into session_commits, renamed pending_counts (the leaner object
--   write counts there too), in the writer's transaction: the row exists
--   exactly when that transaction committed (also when a statement of it ran COMMIT itself). The
--   proxy folds the rows into fence_counts and totals (queries.ts foldPendingCounts) once a
--   second; the count reads add the rows not folded yet, and so does fence_stats. The table is
--   logged now (a crash of Postgres loses no committed count), with no key or index to maintain.
--   Rows left by 0009 (transactions made read-only after writing, which it did not count) go.
--   A rolling upgrade counts POST /v1/transactions twice while proxies of the old version run.
-- - The forgery-guard check runs only when a guard is configured.
-- Apply it with no SQL-endpoint transaction open: DROP TRIGGER waits for them, and new fenced SQL
-- transactions queue behind it.
DROP TRIGGER session_commits_count ON fencepost.session_commits;
DROP FUNCTION fencepost.count_session_commit();
DELETE FROM fencepost.session_commits;
ALTER TABLE fencepost.session_commits DROP COLUMN id;
ALTER TABLE fencepost.session_commits SET LOGGED;
-- Rows of accepted writes too (queries.ts fencedPuts), not only of sessions' commits.
ALTER TABLE fencepost.session_commits RENAME TO pending_counts;

CREATE OR REPLACE FUNCTION fencepost.fence_transaction(capability text, fence_keys text[], tokens bigint[], writer_id text)
RETURNS TABLE (ord int, highest_token bigint, xact bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_highest bigint;
BEGIN
  IF capability IS DISTINCT FROM (SELECT c.secret FROM fencepost.fence_capability c) THEN
    RAISE EXCEPTION 'fencepost.fence_transaction may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  -- One more accepted transaction on each fence, counted when this transaction commits (folded
  -- into the counters by the proxy); a stale fence's transaction never commits. Nothing shared
  -- is held: an insert, where an upsert of the counter rows would hold them until it ends.
  INSERT INTO fencepost.pending_counts (fence_key) SELECT DISTINCT k FROM unnest(fence_keys) AS k;
  -- The leader's case, one fence at its own token: the row FOR SHARE, nothing else. The general
  -- statement below takes the same lock; this skips its planning and its CTEs (a statement of
  -- its own: in READ COMMITTED it waits for a raise in flight and re-checks its committed value).
  IF cardinality(fence_keys) = 1 AND cardinality(tokens) = 1 THEN
    SELECT f.highest_token INTO v_highest FROM fencepost.fences f
    WHERE f.fence_key = fence_keys[1] AND f.highest_token = tokens[1]
    FOR SHARE OF f;
    IF FOUND THEN
      RETURN QUERY SELECT 0, v_highest, txid_current();
      RETURN;
    END IF;
  END IF;
  RETURN QUERY
  WITH input AS (
    SELECT (t.n - 1)::int AS ord, t.fence_key, t.token FROM unnest(fence_keys, tokens) WITH ORDINALITY AS t(fence_key, token, n)
  ),
  held AS (
    SELECT f.fence_key, f.highest_token FROM fencepost.fences f JOIN input i ON i.fence_key = f.fence_key
    WHERE f.highest_token >= i.token
    ORDER BY f.fence_key COLLATE "C"
    FOR SHARE OF f
  ),
  raised AS (
    INSERT INTO fencepost.fences AS f (fence_key, highest_token, raised_by)
    SELECT i.fence_key, i.token, fence_transaction.writer_id FROM input i WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.fence_key = i.fence_key)
    ORDER BY i.fence_key COLLATE "C"
    ON CONFLICT (fence_key) DO UPDATE SET highest_token = EXCLUDED.highest_token, raised_by = EXCLUDED.raised_by, updated_at = now()
      WHERE f.highest_token <= EXCLUDED.highest_token
    RETURNING f.fence_key, f.highest_token, (f.xmax = 0) AS created
  ),
  created AS (
    INSERT INTO fencepost.totals AS t (shard, fences)
    SELECT (32 + pg_backend_pid() % 32)::smallint, count(*) FROM raised WHERE created HAVING count(*) > 0
    ON CONFLICT (shard) DO UPDATE SET fences = t.fences + EXCLUDED.fences
  ),
  fence AS (
    SELECT h.fence_key, h.highest_token FROM held h
    UNION ALL
    SELECT r.fence_key, r.highest_token FROM raised r
  )
  SELECT i.ord, CASE WHEN fence.highest_token = i.token THEN fence.highest_token END, txid_current()
  FROM input i LEFT JOIN fence ON fence.fence_key = i.fence_key
  ORDER BY i.ord;
END $$;

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
    INSERT INTO fencepost.pending_counts (fence_key) VALUES (v_key);
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
  -- fence_transaction() recorded the transaction for its count.
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
  LEFT JOIN (SELECT s.fence_key, count(*) AS n FROM fencepost.pending_counts s GROUP BY s.fence_key) p USING (fence_key)
  GROUP BY f.fence_key;
