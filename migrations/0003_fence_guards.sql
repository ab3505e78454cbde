-- The fence's two promises, enforced by the database itself, whoever runs the SQL (including
-- statements sent through POST /v1/transactions as the proxy's login role): a fence's highest
-- token never goes down, and fence rows are never deleted.
CREATE FUNCTION fencepost.refuse_fence_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    RAISE EXCEPTION 'fence % may not go down from % to %', OLD.fence_key, OLD.highest_token, NEW.highest_token
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RAISE EXCEPTION 'fence rows are never deleted (%)', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END $$;

-- WHEN is evaluated without calling the function, so the hot path (token rises or stays) pays nothing.
CREATE TRIGGER fences_never_lower BEFORE UPDATE ON fencepost.fences
  FOR EACH ROW WHEN (NEW.highest_token < OLD.highest_token OR NEW.fence_key <> OLD.fence_key)
  EXECUTE FUNCTION fencepost.refuse_fence_change();
CREATE TRIGGER fences_never_deleted BEFORE DELETE ON fencepost.fences
  FOR EACH ROW EXECUTE FUNCTION fencepost.refuse_fence_change();
CREATE TRIGGER fences_never_truncated BEFORE TRUNCATE ON fencepost.fences
  FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_fence_change();
