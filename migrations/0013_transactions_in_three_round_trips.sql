-- POST /v1/transactions in three round trips instead of six: one simple Query resets the pooled
-- session, begins and fences; the writer's statements follow; one Query seals and commits.
-- - fence_transaction_bound(): fence_transaction() for a capability bound to this backend and to
--   these very arguments (a SHA-256 of the capability, the backend pid and the arguments), so the
--   call can travel as SQL text. pg_stat_activity shows that text to other sessions of the same
--   login; what they read lets only this backend make this same fence call again, which the
--   proxy does for the same key anyway, and only inside the proxy's own first round trip (the
--   Query must start with the session reset, which no writer's statement can). The arguments are
--   ASCII only (fence keys and writer id in hex, tokens in decimal), so no session setting
--   (client_encoding, standard_conforming_strings) left by an earlier transaction changes how the
--   text is read. The leader's case (one fence at its own token) takes the row FOR SHARE and
--   records its count right here; anything else goes through fence_transaction().
-- - seal_client_transaction(): the end of the fenced transaction, right before COMMIT in the same
--   Query: refuses (FP410) when the transaction is no longer the fenced one (a statement ran
--   COMMIT AND CHAIN), and forces synchronous_commit on.
CREATE FUNCTION fencepost.fence_transaction_bound(transaction_capability text, fence_keys_hex text, tokens text, writer_id_hex text)
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
REVOKE ALL ON FUNCTION fencepost.fence_transaction_bound(text, text, text, text) FROM PUBLIC;

CREATE FUNCTION fencepost.seal_client_transaction(fenced_xact bigint)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF txid_current() IS DISTINCT FROM fenced_xact THEN
    RAISE EXCEPTION 'a statement ended the fenced transaction'
      USING ERRCODE = 'FP410';
  END IF;
  -- Transaction-local (is_local): it holds until COMMIT, past this function's own SET clause.
  PERFORM set_config('synchronous_commit', 'on', true);
END $$;
REVOKE ALL ON FUNCTION fencepost.seal_client_transaction(bigint) FROM PUBLIC;
