-- The SQL doors fence the connection, not the transaction (src/fence/rule.ts): a registry of the
-- backends that passed a fence, and a raise that ends the older-token ones before it commits. The
-- functions are definitions (definitions.ts: fence_session, revoke_older_sessions,
-- refuse_unfenced_write); this makes the registry and the trigger that calls revoke_older_sessions,
-- gives every protected table's trigger its one argument (the fence key), and drops the epoch
-- sequences, the trigger that replaced them on every raise, and the per-transaction proofs.

-- Never reset, never granted: currval() of it names one backend for good (fence_session).
CREATE SEQUENCE fencepost.session_serial;

-- One row per backend and fence key it passed. UNLOGGED: it describes live backends only; a crash
-- (which ends every backend) empties it, so does a failover (a new server, none of the old backends).
CREATE UNLOGGED TABLE fencepost.fenced_backends (
  pid int NOT NULL,
  fence_key text NOT NULL,
  -- With pid: which backend a raise may terminate.
  backend_start timestamptz NOT NULL,
  -- currval(fencepost.session_serial) of that backend: its identity.
  serial bigint NOT NULL,
  token bigint NOT NULL,
  -- The session's fencepost settings when it was fenced (null: none).
  token_setting text,
  fence_key_setting text,
  fenced_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (pid, fence_key)
);
CREATE INDEX fenced_backends_key ON fencepost.fenced_backends (fence_key, token);

-- The trigger needs its function now; definitions.ts replaces this body with the current one.
CREATE FUNCTION fencepost.revoke_older_sessions() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ BEGIN RETURN NULL; END $$;
REVOKE ALL ON FUNCTION fencepost.revoke_older_sessions() FROM PUBLIC;

DROP TRIGGER IF EXISTS fences_next_epoch ON fencepost.fences;
CREATE TRIGGER fences_revoke_older AFTER UPDATE OF highest_token ON fencepost.fences
  FOR EACH ROW WHEN (NEW.highest_token > OLD.highest_token) EXECUTE FUNCTION fencepost.revoke_older_sessions();

-- Every protected table's trigger, with the fence key as its only argument.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT t.relation::regclass AS rel, t.fence_key FROM fencepost.protected_tables t
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g WHERE g.tgrelid = t.relation AND g.tgname = 'fencepost_fence')
  LOOP
    EXECUTE format('DROP TRIGGER fencepost_fence ON %s', r.rel);
    EXECUTE format('CREATE TRIGGER fencepost_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_unfenced_write(%L)',
                   r.rel, r.fence_key);
  END LOOP;
END $$;

-- The epochs and what used them. The view is a definition, made again after this.
DROP VIEW IF EXISTS fencepost.protected_data;
DROP FUNCTION IF EXISTS fencepost.next_epoch();
DROP FUNCTION IF EXISTS fencepost.epoch_name(text);
DROP FUNCTION IF EXISTS fencepost_api.prove_epoch(oid, text, bigint);
DROP PROCEDURE IF EXISTS fencepost_api.prove(oid, text, bigint);
DROP FUNCTION IF EXISTS fencepost_api.prove_transaction(text, text, bigint);
DROP FUNCTION IF EXISTS fencepost_api.prove_epochs(text[]);
DROP FUNCTION IF EXISTS fencepost.refuse_unproven_session(text, bigint);
DROP FUNCTION IF EXISTS fencepost_api.refuse_transaction(text, text, text, text);
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT c.oid::regclass AS seq FROM pg_catalog.pg_class c
    WHERE c.relnamespace = 'fencepost'::regnamespace AND c.relkind = 'S' AND starts_with(c.relname, 'epoch_')
  LOOP
    EXECUTE format('DROP SEQUENCE %s', r.seq);
  END LOOP;
END $$;
