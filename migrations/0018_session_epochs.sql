-- The SQL doors fence the session, not the transaction (src/fence/rule.ts): each fence key a
-- session fences gets an epoch sequence, which every raise of that fence drops and makes anew. The
-- functions are definitions (definitions.ts: fence_session, next_epoch, refuse_unfenced_write);
-- this creates the trigger that calls next_epoch, gives every protected table's trigger its epoch,
-- and drops the per-transaction fence functions the doors no longer call.

-- The trigger needs its function now; definitions.ts replaces this body with the current one.
CREATE OR REPLACE FUNCTION fencepost.next_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_name text := 'epoch_' || left(encode(sha256(convert_to(NEW.fence_key, 'UTF8')), 'hex'), 56);
BEGIN
  IF to_regclass('fencepost.' || quote_ident(v_name)) IS NOT NULL THEN
    EXECUTE format('DROP SEQUENCE fencepost.%I', v_name);
    EXECUTE format('CREATE SEQUENCE fencepost.%I', v_name);
    EXECUTE format('GRANT SELECT ON SEQUENCE fencepost.%I TO PUBLIC', v_name);
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION fencepost.next_epoch() FROM PUBLIC;

CREATE TRIGGER fences_next_epoch AFTER UPDATE OF highest_token ON fencepost.fences
  FOR EACH ROW WHEN (NEW.highest_token > OLD.highest_token) EXECUTE FUNCTION fencepost.next_epoch();

-- Every protected table's trigger, again with its epoch sequence as the second argument (the
-- trigger function computes it when absent, at the cost of a hash per statement).
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT t.relation::regclass AS rel, t.fence_key FROM fencepost.protected_tables t
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g WHERE g.tgrelid = t.relation AND g.tgname = 'fencepost_fence')
  LOOP
    EXECUTE format('DROP TRIGGER fencepost_fence ON %s', r.rel);
    EXECUTE format('CREATE TRIGGER fencepost_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_unfenced_write(%L, %L)',
                   r.rel, r.fence_key, 'fencepost.epoch_' || left(encode(sha256(convert_to(r.fence_key, 'UTF8')), 'hex'), 56));
  END LOOP;
END $$;

DROP FUNCTION IF EXISTS fencepost.fence_session_bound(text, text, text, text);
DROP FUNCTION IF EXISTS fencepost.session_fence_check(text[], text);
DROP FUNCTION IF EXISTS fencepost.session_guard_check(jsonb);
DROP FUNCTION IF EXISTS fencepost.fence_transaction_bound(text, text, text, text);
DROP FUNCTION IF EXISTS fencepost.fence_transaction(text, text[], bigint[], text);
DROP FUNCTION IF EXISTS fencepost.seal_client_transaction(bigint);
