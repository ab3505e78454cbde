-- Each logged rejection names the door that refused it: `http` (object writes and fences),
-- `transaction` (POST /v1/transactions) or `sql` (the SQL endpoint; its refusals keep operation
-- `transaction`). Rows logged before this are backfilled from their operation: SQL-endpoint
-- rejections among them cannot be told apart and read `transaction`. The column comes with a
-- default (no rewrite of the table), so only the transaction rows are updated; then the default
-- goes: every insert names its door.
ALTER TABLE fencepost.rejections
  ADD COLUMN door text NOT NULL DEFAULT 'http' CONSTRAINT rejections_door CHECK (door IN ('http', 'transaction', 'sql'));
UPDATE fencepost.rejections SET door = 'transaction' WHERE operation = 'transaction';
ALTER TABLE fencepost.rejections ALTER COLUMN door DROP DEFAULT;

-- Proxies of the previous version log rejections without a door during a rolling upgrade: their
-- rows get the door the backfill gives, instead of failing the NOT NULL.
CREATE FUNCTION fencepost.rejection_door_of_old_proxies()
RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  NEW.door := CASE WHEN NEW.operation = 'transaction' THEN 'transaction' ELSE 'http' END;
  RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION fencepost.rejection_door_of_old_proxies() FROM PUBLIC;
CREATE TRIGGER rejection_door_of_old_proxies BEFORE INSERT ON fencepost.rejections
  FOR EACH ROW WHEN (NEW.door IS NULL) EXECUTE FUNCTION fencepost.rejection_door_of_old_proxies();
