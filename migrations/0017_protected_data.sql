-- Protected data (`fencepost protect`, src/fence/protect.ts): what each fence key guards, declared
-- by an operator and enforced by Postgres itself.
-- - protected_tables: a table written through the SQL doors (the SQL endpoint, POST
--   /v1/transactions). Its trigger `fencepost_fence` (definitions.ts refuse_unfenced_write) refuses
--   INSERT, UPDATE, DELETE, TRUNCATE, COPY FROM and MERGE in any transaction that did not pass that
--   fence at its highest token, whoever sends them and however: through the proxy or straight to
--   Postgres.
-- - protected_prefixes: object keys (HTTP door) under a prefix are written under its fence key,
--   whatever Fence-Key says; a trigger on fencepost.objects refuses any other.
CREATE TABLE fencepost.protected_tables (
  relation oid PRIMARY KEY,
  fence_key text NOT NULL CONSTRAINT protected_tables_fence_key CHECK (octet_length(fence_key) BETWEEN 1 AND 1024),
  declared_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE fencepost.protected_prefixes (
  prefix text PRIMARY KEY CONSTRAINT protected_prefixes_prefix CHECK (prefix <> ''),
  fence_key text NOT NULL CONSTRAINT protected_prefixes_fence_key CHECK (octet_length(fence_key) BETWEEN 1 AND 1024),
  declared_at timestamptz NOT NULL DEFAULT now()
);
