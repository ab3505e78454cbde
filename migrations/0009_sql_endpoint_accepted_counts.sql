-- Accepted counts for the SQL endpoint's transactions: a transaction that fence_session() fenced
-- with a token is counted as accepted on its fence when it commits, and only then, like an HTTP
-- write or a POST /v1/transactions (whose seal_transaction() counts right before COMMIT).
--
-- The endpoint cannot run a statement of its own right before the writer's COMMIT (the writer's
-- COMMIT may come in the middle of a Query, from a procedure, or not at all in an implicit
-- transaction), and counting in the fence itself would hold the counter rows (fence_counts and
-- totals, striped by pg_backend_pid() % 32) for the whole transaction: sessions whose backends
-- share a stripe would serialize, and could deadlock through the writers' own rows. So the fence
-- records one row here, and a deferred constraint trigger counts it at COMMIT: the count commits
-- with the transaction or rolls back with it, and the counter rows are held for the commit's time
-- only (as seal_transaction() holds them). A writer that runs SET CONSTRAINTS ALL IMMEDIATE makes
-- its count happen at once and holds its stripe's counter rows for the rest of its transaction:
-- slower for that stripe, never a wrong count.
CREATE UNLOGGED TABLE fencepost.session_commits (
  id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  fence_key text NOT NULL
);
REVOKE ALL ON fencepost.session_commits FROM PUBLIC;

CREATE FUNCTION fencepost.count_session_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- A writer that made its transaction read-only after writing (SET TRANSACTION READ ONLY) still
  -- commits; it is not counted (nothing may be written now).
  IF current_setting('transaction_read_only') = 'on' THEN
    RETURN NULL;
  END IF;
  INSERT INTO fencepost.fence_counts AS c (fence_key, shard, accepted)
  VALUES (NEW.fence_key, (pg_backend_pid() % 32)::smallint, 1)
  ON CONFLICT (fence_key, shard) DO UPDATE SET accepted = c.accepted + 1;
  INSERT INTO fencepost.totals AS t (shard, accepted) VALUES ((pg_backend_pid() % 32)::smallint, 1)
  ON CONFLICT (shard) DO UPDATE SET accepted = t.accepted + 1;
  DELETE FROM fencepost.session_commits WHERE id = NEW.id;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION fencepost.count_session_commit() FROM PUBLIC;

CREATE CONSTRAINT TRIGGER session_commits_count AFTER INSERT ON fencepost.session_commits
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION fencepost.count_session_commit();

-- Migration 0008's check, now recording the transaction for its count when it is fenced.
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
  -- Counted as accepted at COMMIT (the deferred trigger above), or not at all.
  INSERT INTO fencepost.session_commits (fence_key) VALUES (v_key);
  RETURN true;
END $$;
REVOKE ALL ON FUNCTION fencepost.session_fence_check(text[], text) FROM PUBLIC;
