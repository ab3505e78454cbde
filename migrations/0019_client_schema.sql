-- The functions client logins and keys' roles call move to a schema of their own, fencepost_api,
-- which holds no table or sequence (definitions.ts makes them there). Those roles lose USAGE on
-- schema fencepost: a role that can name a table may queue a DDL lock on it (CREATE RULE, CREATE
-- TRIGGER, REFERENCES) before Postgres checks that it owns it, and every later lock, another
-- tenant's included, waits behind that request. The epoch sequences become the owner's alone
-- (the proofs read them in functions of the owner's), so no one else can hold one to delay a raise.

CREATE SCHEMA fencepost_api;

-- The roles the proxy granted the fence to: its client logins and the keys' roles.
DO $$
DECLARE
  r record;
BEGIN
  IF to_regprocedure('fencepost.fence_session(text, text, bigint)') IS NOT NULL THEN
    FOR r IN
      SELECT a.grantee::regrole AS role
      FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
      WHERE p.oid = 'fencepost.fence_session(text, text, bigint)'::regprocedure
        AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
      EXECUTE format('REVOKE USAGE ON SCHEMA fencepost FROM %s', r.role);
    END LOOP;
  END IF;
END $$;

DROP FUNCTION IF EXISTS fencepost.fence_session(text, text, bigint);
DROP FUNCTION IF EXISTS fencepost.session_proof(text, text, bigint);
DROP FUNCTION IF EXISTS fencepost.prove_transaction(text, text, bigint);
DROP FUNCTION IF EXISTS fencepost.refuse_transaction(text, text, text, text);
DROP FUNCTION IF EXISTS fencepost.discard_temp();

DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT c.oid::regclass AS seq FROM pg_catalog.pg_class c
    WHERE c.relnamespace = 'fencepost'::regnamespace AND c.relkind = 'S' AND starts_with(c.relname, 'epoch_')
  LOOP
    EXECUTE format('REVOKE ALL ON SEQUENCE %s FROM PUBLIC', r.seq);
  END LOOP;
END $$;
