-- The SQL endpoint's leader case answered inside the capability-checking function itself, as
-- fence_transaction_bound does (migration 0013): a transaction on one fence at the fence's own
-- token takes the fence row FOR SHARE, records its count row and returns, without the nested
-- functions (each with its own search_path), the token's and key's validation and the prefix
-- query. Measured with pgbench sending the endpoint's statements straight to Postgres, those cost
-- a sixth of the whole transaction. Anything else (a raise, a new fence, a stale or malformed
-- token, a key outside the prefixes) takes the full path, unchanged. The fast path needs no
-- validation of its own: it runs only for a token of at most 18 digits (always a bigint) and a
-- key that already names a fence, and the forgery guard has nothing to say about a transaction
-- that raises nothing.
CREATE OR REPLACE FUNCTION fencepost.fence_session_bound(session_capability text, fence_key_prefixes text, writer_id text, guard text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_secret text := (SELECT c.secret FROM fencepost.fence_capability c);
  v_raw    text;
  v_key    text;
  v_prefix text;
  v_inside boolean;
BEGIN
  IF session_capability IS DISTINCT FROM encode(sha256(convert_to(
       v_secret || '|' || pg_backend_pid() || '|' || coalesce(fence_key_prefixes, 'NULL') || '|' || writer_id || '|' || coalesce(guard, 'NULL') || '|' || v_secret, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'fencepost.fence_session_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  v_raw := current_setting('fencepost.token', true);
  v_key := current_setting('fencepost.fence_key', true);
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
      PERFORM FROM fencepost.fences f WHERE f.fence_key = v_key AND f.highest_token = v_raw::bigint FOR SHARE OF f;
      IF FOUND THEN
        INSERT INTO fencepost.pending_counts (fence_key) VALUES (v_key);
        RETURN true;
      END IF;
    END IF;
  END IF;
  IF guard IS NOT NULL THEN
    PERFORM fencepost.session_guard_check(guard::jsonb);
  END IF;
  RETURN fencepost.session_fence_check(fence_key_prefixes::text[], writer_id);
END $$;
