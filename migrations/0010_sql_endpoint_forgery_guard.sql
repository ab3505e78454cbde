-- The token forgery guard on the SQL endpoint (src/proxy/forgery-guard.ts): a session's token may
-- raise a guarded fence only if the proxy's guard admitted that (fence key, token). The proxy
-- learns the session's settings (startup options; after the writer's text mentions `fencepost`,
-- it reads them back), asks the guard before the session's next transaction, and passes what it
-- found to the fence as `guard` (JSON text, null when no guard is configured):
--   {"prefixes": [guarded fence-key prefixes], "fenceKey": k, "token": "t"[, "unavailable": true]}
-- The check here is the boundary, whatever the proxy could not see: the settings as they are in
-- this transaction must be the admitted pair, or the token must not raise the fence (≤ its
-- highest: fences only rise, so such a token never raises it later either); otherwise the
-- transaction fails before its first statement, FP409 "unverified token" (FP503 when the guard
-- could not reach ZooKeeper for that very pair: safe to retry). Malformed settings are left to
-- session_fence_check (FP400).
CREATE FUNCTION fencepost.session_guard_check(guard jsonb)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_raw   text := current_setting('fencepost.token', true);
  v_key   text := current_setting('fencepost.fence_key', true);
  v_token bigint;
  v_highest bigint;
BEGIN
  IF guard IS NULL OR v_raw IS NULL OR v_raw !~ '^[0-9]+$' OR ltrim(v_raw, '0') !~ '^[0-9]{0,19}$' OR v_raw::numeric > 9223372036854775807
     OR v_key IS NULL OR v_key = '' THEN
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
END $$;
REVOKE ALL ON FUNCTION fencepost.session_guard_check(jsonb) FROM PUBLIC;

CREATE FUNCTION fencepost.fence_session(capability text, fence_key_prefixes text[], writer_id text, guard text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF capability IS DISTINCT FROM (SELECT c.secret FROM fencepost.fence_capability c) THEN
    RAISE EXCEPTION 'fencepost.fence_session may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  PERFORM fencepost.session_guard_check(guard::jsonb);
  RETURN fencepost.session_fence_check(fence_key_prefixes, writer_id);
END $$;
REVOKE ALL ON FUNCTION fencepost.fence_session(text, text[], text, text) FROM PUBLIC;

-- The session capability now covers the guard state too: a writer who reads it in
-- pg_stat_activity cannot call this with a guard state of its own.
CREATE FUNCTION fencepost.fence_session_bound(session_capability text, fence_key_prefixes text, writer_id text, guard text)
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
  PERFORM fencepost.session_guard_check(guard::jsonb);
  RETURN fencepost.session_fence_check(fence_key_prefixes::text[], writer_id);
END $$;
REVOKE ALL ON FUNCTION fencepost.fence_session_bound(text, text, text, text) FROM PUBLIC;
