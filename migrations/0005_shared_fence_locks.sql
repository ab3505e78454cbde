-- A leader's writes under one fence key at database speed: writes whose token equals the fence's
-- highest take the fence row FOR SHARE (they run in parallel); only a raise takes it exclusively.
-- So nothing else may be written on the hot fence row per write: the counts move to tables of
-- their own, striped by backend (shard = pg_backend_pid() % 32), so concurrent statements rarely
-- touch the same counter row. `fences.updated_at` now changes only when the fence is created or
-- raised.

CREATE TABLE fencepost.fence_counts (
  fence_key text     NOT NULL,
  shard     smallint NOT NULL,
  accepted  bigint   NOT NULL DEFAULT 0,
  rejected  bigint   NOT NULL DEFAULT 0,
  PRIMARY KEY (fence_key, shard)
);
-- (The ops view finds fences with rejections through the rejection log, not by scanning counts.)

-- Totals for /v1/stats, kept as writes commit (reading them is 32 rows, not every fence).
CREATE TABLE fencepost.totals (
  shard    smallint PRIMARY KEY,
  fences   bigint   NOT NULL DEFAULT 0,
  accepted bigint   NOT NULL DEFAULT 0,
  rejected bigint   NOT NULL DEFAULT 0
);

-- Rejections per minute, for the histogram over all fences (the log itself is pruned by age and
-- row count; these are kept for a day, the histogram's longest window).
CREATE TABLE fencepost.rejection_minutes (
  minute timestamptz NOT NULL,
  shard  smallint    NOT NULL,
  count  bigint      NOT NULL DEFAULT 0,
  PRIMARY KEY (minute, shard)
);

INSERT INTO fencepost.fence_counts (fence_key, shard, accepted, rejected)
  SELECT fence_key, 0, accepted, rejected FROM fencepost.fences WHERE accepted > 0 OR rejected > 0;
INSERT INTO fencepost.totals (shard, fences, accepted, rejected)
  SELECT 0, count(*), coalesce(sum(accepted), 0), coalesce(sum(rejected), 0) FROM fencepost.fences;
INSERT INTO fencepost.rejection_minutes (minute, shard, count)
  SELECT date_trunc('minute', rejected_at), 0, count(*) FROM fencepost.rejections
  WHERE rejected_at > now() - interval '1 day' GROUP BY 1;
ALTER TABLE fencepost.fences DROP COLUMN accepted, DROP COLUMN rejected;

-- Key-ordered paging in byte order (GET /v1/fences) walks this index instead of sorting.
CREATE INDEX fences_key_bytes ON fencepost.fences (fence_key COLLATE "C");
-- /v1/stats fills its list with the most recently raised fences.
CREATE INDEX fences_updated_at ON fencepost.fences (updated_at DESC);
-- The histogram of one fence.
CREATE INDEX rejections_fence_key_time ON fencepost.rejections (fence_key, rejected_at);

-- Each fence with its counts, for operators at a psql prompt (the proxy reads the same sums).
CREATE VIEW fencepost.fence_stats AS
  SELECT f.fence_key, f.highest_token, f.created_at, f.updated_at,
    coalesce(sum(c.accepted), 0)::bigint AS accepted, coalesce(sum(c.rejected), 0)::bigint AS rejected
  FROM fencepost.fences f LEFT JOIN fencepost.fence_counts c USING (fence_key)
  GROUP BY f.fence_key;

REVOKE ALL ON ALL TABLES IN SCHEMA fencepost FROM PUBLIC;

-- Transactions: equal tokens share the fence row, a higher token raises it exclusively, a lower
-- one is stale. Counting happens at the seal, right before COMMIT, so counter rows are held for a
-- commit's time, not the transaction's.
CREATE OR REPLACE FUNCTION fencepost.fence_transaction(capability text, fence_keys text[], tokens bigint[])
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
    INSERT INTO fencepost.fences AS f (fence_key, highest_token)
    SELECT i.fence_key, i.token FROM input i WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.fence_key = i.fence_key)
    ORDER BY i.fence_key COLLATE "C"
    ON CONFLICT (fence_key) DO UPDATE SET highest_token = EXCLUDED.highest_token, updated_at = now()
      WHERE f.highest_token <= EXCLUDED.highest_token
    RETURNING f.fence_key, f.highest_token, (f.xmax = 0) AS created
  ),
  created AS (
    INSERT INTO fencepost.totals AS t (shard, fences)
    SELECT (pg_backend_pid() % 32)::smallint, count(*) FROM raised WHERE created HAVING count(*) > 0
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

-- The seal, right before COMMIT: counts the transaction as accepted on each of its fences and
-- returns the transaction id (the proxy compares it with fence_transaction's).
CREATE FUNCTION fencepost.seal_transaction(capability text, fence_keys text[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF capability IS DISTINCT FROM (SELECT c.secret FROM fencepost.fence_capability c) THEN
    RAISE EXCEPTION 'fencepost.seal_transaction may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  INSERT INTO fencepost.fence_counts AS c (fence_key, shard, accepted)
  SELECT k, (pg_backend_pid() % 32)::smallint, 1 FROM unnest(fence_keys) AS k ORDER BY k COLLATE "C"
  ON CONFLICT (fence_key, shard) DO UPDATE SET accepted = c.accepted + 1;
  INSERT INTO fencepost.totals AS t (shard, accepted) VALUES ((pg_backend_pid() % 32)::smallint, cardinality(fence_keys))
  ON CONFLICT (shard) DO UPDATE SET accepted = t.accepted + EXCLUDED.accepted;
  RETURN txid_current();
END $$;
REVOKE ALL ON FUNCTION fencepost.seal_transaction(text, text[]) FROM PUBLIC;
