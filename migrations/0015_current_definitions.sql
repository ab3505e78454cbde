-- Functions and views now exist once, in current form: src/fence/definitions.ts, applied by
-- migrate() after the migrations whenever they change (this table records which ones the database
-- has). Migrations stay the history of tables.
CREATE TABLE fencepost.definitions (
  only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
  version    integer     NOT NULL,
  sha256     text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON fencepost.definitions FROM PUBLIC;

-- Overloads nothing calls any more: the three-argument fence_transaction (kept for proxies of
-- 0007's predecessor), seal_transaction (counts moved to pending_counts in 0012), and the SQL
-- endpoint's fence_session in both forms and fence_session_bound without the guard state (the
-- endpoint calls fence_session_bound with it, 0010). Their grants go with them.
DROP FUNCTION fencepost.fence_transaction(text, text[], bigint[]);
DROP FUNCTION fencepost.seal_transaction(text, text[]);
DROP FUNCTION fencepost.fence_session(text, text[], text);
DROP FUNCTION fencepost.fence_session(text, text[], text, text);
DROP FUNCTION fencepost.fence_session_bound(text, text, text);
