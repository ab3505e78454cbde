-- Each logged rejection names the door that refused it: `http` (object writes and fences),
-- `transaction` (POST /v1/transactions) or `sql` (the SQL endpoint; its refusals keep operation
-- `transaction`). Rows logged before this are backfilled from their operation: SQL-endpoint
-- rejections among them cannot be told apart and read `transaction`. The default stays for rows
-- that name no door, those of proxies of the previous version during a rolling upgrade (they
-- read `http`); this version names the door of every row.
ALTER TABLE fencepost.rejections
  ADD COLUMN door text NOT NULL DEFAULT 'http' CONSTRAINT rejections_door CHECK (door IN ('http', 'transaction', 'sql'));
UPDATE fencepost.rejections SET door = 'transaction' WHERE operation = 'transaction';
