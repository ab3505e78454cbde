-- A transaction that creates a fence counts it in fencepost.totals, and holds that counter row
-- until the transaction ends. Object writes count in shards 0–31; transactions now count fence
-- creation in shards 32–63, so a long transaction never makes an unrelated object write wait on
-- a counter row (found in review). /v1/stats sums every shard.
CREATE OR REPLACE FUNCTION fencepost.fence_transaction(capability text, fence_keys text[], tokens bigint[], writer_id text)
RETURNS TABLE (ord int, highest_token bigint, xact bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  IF capability IS DISTINCT FROM (SELECT c.secret FROM fencepost.fence_capability c) THEN
    RAISE EXCEPTION 'fencepost.fence_transaction may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
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
