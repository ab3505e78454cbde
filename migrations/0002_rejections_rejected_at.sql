-- The rejection log is read by time (GET /v1/rejections/histogram) and pruned by age
-- (src/fence/retention.ts): both scan a range of rejected_at.
CREATE INDEX rejections_rejected_at ON fencepost.rejections (rejected_at);
