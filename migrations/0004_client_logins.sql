-- Client SQL (POST /v1/transactions) runs on logins of its own, never as the owner of this schema:
-- src/fence/client-logins.ts creates one login per key (member of that key's pgRole only) or
-- `fencepost_client` in open mode. Those logins own nothing and may not read or write any table
-- here; they reach the fence only through fence_transaction() below.

-- Passwords of the client logins this database created (the proxy connects as them). Owner only.
CREATE TABLE fencepost.client_logins (
  login      text        PRIMARY KEY,
  password   text        NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- The capability the proxy passes (as a bind parameter, never in SQL text) to fence_transaction():
-- client SQL runs on logins that may execute the function, so the function must know its caller
-- is the proxy, not a statement of the transaction trying to raise some other fence.
CREATE TABLE fencepost.fence_capability (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  secret   text    NOT NULL
);
INSERT INTO fencepost.fence_capability (secret)
  VALUES (md5(gen_random_uuid()::text) || md5(gen_random_uuid()::text));

REVOKE ALL ON SCHEMA fencepost FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA fencepost FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA fencepost FROM PUBLIC;

-- The fence check and raise of a transaction, run by the proxy as the transaction's first
-- statement on the client login's connection, so it commits with the writer's statements or not
-- at all. The same conditional upsert as fenced object writes (rows locked in byte order). One row
-- per input: highest_token null when the token is below the fence. `xact` is the transaction id,
-- which the proxy compares again before COMMIT: a statement that ended the transaction (COMMIT AND
-- CHAIN, …) cannot smuggle an unfenced transaction into the proxy's COMMIT.
CREATE FUNCTION fencepost.fence_transaction(capability text, fence_keys text[], tokens bigint[])
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
  fence AS (
    INSERT INTO fencepost.fences AS f (fence_key, highest_token, accepted)
    SELECT i.fence_key, i.token, 1 FROM input i ORDER BY i.fence_key COLLATE "C"
    ON CONFLICT (fence_key) DO UPDATE
      SET highest_token = GREATEST(f.highest_token, EXCLUDED.highest_token), accepted = f.accepted + 1, updated_at = now()
      WHERE f.highest_token <= EXCLUDED.highest_token
    RETURNING f.fence_key, f.highest_token
  )
  SELECT i.ord, fence.highest_token, txid_current()
  FROM input i LEFT JOIN fence ON fence.fence_key = i.fence_key
  ORDER BY i.ord;
END $$;
REVOKE ALL ON FUNCTION fencepost.fence_transaction(text, text[], bigint[]) FROM PUBLIC;
