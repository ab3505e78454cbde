-- GET /v1/objects lists objects in key order, byte order like GET /v1/fences: keyset paging walks
-- this index from its cursor (and up to the end of a prefix) instead of sorting.
CREATE INDEX objects_key_bytes ON fencepost.objects (key COLLATE "C");

-- Conditional writes (If-Match, If-None-Match) compare ETags inside the fenced write statement, so
-- an ETag is made of columns: "<incarnation>.<version>". The version alone starts again at 1 when
-- a deleted key is written again, so a client holding "1" of the old object would match the new
-- one; the incarnation is drawn once per creation of a key and never repeats. Rows already there
-- keep 0 (every creation from now on draws 1 or more): adding the column rewrites nothing.
CREATE SEQUENCE fencepost.object_incarnations;
ALTER TABLE fencepost.objects ADD COLUMN incarnation bigint NOT NULL DEFAULT 0;
ALTER TABLE fencepost.objects ALTER COLUMN incarnation SET DEFAULT nextval('fencepost.object_incarnations');
REVOKE ALL ON SEQUENCE fencepost.object_incarnations FROM PUBLIC;
