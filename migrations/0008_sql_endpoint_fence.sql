-- The SQL endpoint (src/proxy/pgwire): a writer's session carries its token and fence key as
-- session settings, `fencepost.token` and `fencepost.fence_key` (startup options or SET; SHOW reads
-- them). The proxy calls fence_session() at the start of every transaction of the session, inside
-- that transaction and before its statements, with the capability as a bind parameter (never in
-- SQL text): the same check and raise as fence_transaction() (equal tokens share the fence row, a
-- higher one raises it), so the fence commits with the writer's statements or not at all.
--
-- Sessions start with default_transaction_read_only = on; the proxy makes a transaction
-- read-write right before this call and makes it read-only again when this returns false (the
-- session has no token). A stale token raises SQLSTATE FP409 and the whole transaction fails.
-- Fence keys follow the HTTP rules (1–1024 bytes, no control characters); tokens are 0…2^63-1
-- in decimal digits. `fence_key_prefixes` (null in open mode) are the key's: the fence key must
-- start with one of them.
--
-- Two doors to the same check: fence_session() takes the capability (extended protocol: a bind
-- parameter); fence_session_bound() takes a session capability, a hash of the capability with the
-- backend's pid, the prefixes and the writer id, for the simple protocol, where the proxy can only
-- prepend SQL text (visible in pg_stat_activity to sessions of the same role): it is good for that
-- one backend with exactly those prefixes and writer, so whoever reads it can do nothing the proxy
-- would not do for that session anyway.
CREATE FUNCTION fencepost.session_fence_check(fence_key_prefixes text[], writer_id text)
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
  RETURN true;
END $$;
REVOKE ALL ON FUNCTION fencepost.session_fence_check(text[], text) FROM PUBLIC;

CREATE FUNCTION fencepost.fence_session(capability text, fence_key_prefixes text[], writer_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF capability IS DISTINCT FROM (SELECT c.secret FROM fencepost.fence_capability c) THEN
    RAISE EXCEPTION 'fencepost.fence_session may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN fencepost.session_fence_check(fence_key_prefixes, writer_id);
END $$;
REVOKE ALL ON FUNCTION fencepost.fence_session(text, text[], text) FROM PUBLIC;

-- `fence_key_prefixes` as array text ('{"w/","x/"}', null in open mode), hashed as given.
CREATE FUNCTION fencepost.fence_session_bound(session_capability text, fence_key_prefixes text, writer_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_secret text := (SELECT c.secret FROM fencepost.fence_capability c);
BEGIN
  IF session_capability IS DISTINCT FROM encode(sha256(convert_to(
       v_secret || '|' || pg_backend_pid() || '|' || coalesce(fence_key_prefixes, 'NULL') || '|' || writer_id || '|' || v_secret, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'fencepost.fence_session_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN fencepost.session_fence_check(fence_key_prefixes::text[], writer_id);
END $$;
REVOKE ALL ON FUNCTION fencepost.fence_session_bound(text, text, text) FROM PUBLIC;
