-- The leader's case answered inside the capability-checking function itself, without the calls
-- behind it: an SQL-endpoint transaction (fence_session_bound) or a POST /v1/transactions
-- transaction (fence_transaction_bound) on one fence at the fence's own token takes the fence row
-- FOR SHARE, records its count row and returns. Measured with pgbench sending the endpoint's
-- statements straight to Postgres, the nested functions (each with its own search_path), the
-- token's and key's validation and the prefix query cost a sixth of the whole transaction.
-- Anything else (a raise, a new fence, a stale or malformed token, a key outside the prefixes)
-- takes the full path, unchanged. The fast path needs no validation of its own: it runs only for
-- a token of at most 18 digits (always a bigint) and a key that already names a fence, and the
-- forgery guard has nothing to say about a transaction that raises nothing.
-- fence_transaction_bound() also runs only inside the proxy's own first round trip (a replay of
-- its text by a writer's statement on the same backend is refused).
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

CREATE OR REPLACE FUNCTION fencepost.fence_transaction_bound(transaction_capability text, fence_keys_hex text, tokens text, writer_id_hex text)
RETURNS TABLE (ord int, highest_token bigint, xact bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_secret text := (SELECT c.secret FROM fencepost.fence_capability c);
  v_key    text;
BEGIN
  IF transaction_capability IS DISTINCT FROM encode(sha256(convert_to(
       v_secret || '|' || pg_backend_pid() || '|' || fence_keys_hex || '|' || tokens || '|' || coalesce(writer_id_hex, 'NULL') || '|' || v_secret, 'UTF8')), 'hex') THEN
    RAISE EXCEPTION 'fencepost.fence_transaction_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  -- Only in the proxy's own first round trip (queries.ts openClientTransaction), which starts with
  -- the session reset: several statements in one Query, which no writer's statement (one per
  -- Parse) can be. A writer that read this call's text in pg_stat_activity cannot replay it on
  -- the same backend later.
  IF NOT starts_with(current_query(), 'BEGIN; RESET ALL; SET SESSION AUTHORIZATION DEFAULT; ') THEN
    RAISE EXCEPTION 'fencepost.fence_transaction_bound may be called by the proxy only'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF strpos(fence_keys_hex, ',') = 0 AND tokens ~ '^[0-9]{1,18}$' THEN
    v_key := convert_from(decode(fence_keys_hex, 'hex'), 'UTF8');
    PERFORM FROM fencepost.fences f WHERE f.fence_key = v_key AND f.highest_token = tokens::bigint FOR SHARE OF f;
    IF FOUND THEN
      INSERT INTO fencepost.pending_counts (fence_key) VALUES (v_key);
      RETURN QUERY SELECT 0, tokens::bigint, txid_current();
      RETURN;
    END IF;
  END IF;
  RETURN QUERY SELECT f.ord, f.highest_token, f.xact FROM fencepost.fence_transaction(v_secret,
    ARRAY(SELECT convert_from(decode(h, 'hex'), 'UTF8') FROM unnest(string_to_array(fence_keys_hex, ',')) WITH ORDINALITY AS t(h, n) ORDER BY t.n),
    string_to_array(tokens, ',')::bigint[],
    convert_from(decode(writer_id_hex, 'hex'), 'UTF8')) f;
END $$;
