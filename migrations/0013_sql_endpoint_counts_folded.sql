-- SQL-endpoint transactions counted without a trigger at COMMIT (migration 0009 counted each one
-- with a deferred constraint trigger: two counter upserts and a delete inside every fenced
-- transaction, a fifth of its cost). The fence still records one row per fenced transaction in
-- session_commits, in the writer's transaction: the row exists if and only if that transaction
-- committed. The proxy folds the rows into fence_counts and totals (queries.ts
-- foldSessionCommits: deleted and counted in one statement, so each is counted exactly once, by
-- whichever proxy takes it) before every read of the counts and once a second. The table is now
-- logged, so a crash of Postgres loses no committed count.
--
-- A writer that makes its transaction read-only after writing is now counted when it commits (the
-- trigger could not write in it, and skipped it).
DROP TRIGGER session_commits_count ON fencepost.session_commits;
DROP FUNCTION fencepost.count_session_commit();
ALTER TABLE fencepost.session_commits SET LOGGED;
