-- A leader's transaction on one fence at the fence's own token takes the fence row FOR SHARE in a
-- statement of its own and returns: no planning of the general statement's CTEs. Raises, new
-- fences, stale tokens and several fences take the general path, unchanged (the lock protocol
-- of fencedWrite: share for the fence's own token, exclusive to raise). Used by POST
-- /v1/transactions and, through session_fence_check(), by every fenced SQL-endpoint transaction.
-- It also records the transaction for its accepted count (session_commits), so POST
-- /v1/transactions no longer counts with a statement of its own after COMMIT.
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
  -- One more accepted transaction on each fence, counted when this transaction commits (the proxy
  -- folds session_commits into the counters, migration 0013); a stale fence's transaction never
  -- commits. Nothing shared is held: an insert, where an upsert of the counter rows would hold
  -- them until this transaction ends.
  INSERT INTO fencepost.session_commits (fence_key) SELECT DISTINCT k FROM unnest(fence_keys) AS k;
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
