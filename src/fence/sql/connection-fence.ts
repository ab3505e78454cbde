// The SQL endpoint's two statements of its own on a writer's backend, both before the writer hears
// that its session is ready (session-fence.ts), each a simple Query in a transaction of its
// own: nothing is sent into the session after them. Everything spliced is the proxy's own or a
// literal.
//
// What a connect costs is what these two cost on a backend that has just started (every catalog it
// touches is read for the first time), so they do no more than the fence needs:
// - the backend's start is read by a plain SELECT of pg_catalog's functions, as the login itself
//   (SET LOCAL ROLE NONE: a key's pgRole, which the session starts as, may not read its login's
//   backend in pg_stat_activity): it writes nothing and commits nothing (no function call, no WAL,
//   no flush). Nothing in it resolves through the session's search_path, and a wrong value would
//   only make fence_session refuse (it computes the start again itself);
// - fence_session registers the backend, committed with synchronous_commit off: its commit is
//   visible at once (a raise reads the registry as soon as it commits), and only its durability is
//   deferred, which nothing needs: what it writes dies with the backend in a crash (the registry
//   is UNLOGGED, emptied by crash recovery; the row lock goes with the session), the serial it may
//   take (fencepost.session_serial) names a backend only in that registry and that backend, and any
//   commit of the writer's own flushes the WAL before it, this one included. It makes no temporary
//   object (the one that keeps a protected write from being prepared, rule.ts NO_PREPARE_READ, is
//   made by the session's first protected write). It raises nothing
//   (raise.ts does, in a transaction of the proxy's own, synchronous_commit on).
import pg from 'pg';
import { BACKEND_START_SQL, sessionFenceCapability, type BackendIdentity } from './rule.ts';

/** The backend's start, as fence_session binds capabilities to it: one row. */
export function connectionSetup(): string {
  return `SET LOCAL ROLE NONE; SELECT ${BACKEND_START_SQL}`;
}

/**
 * Registers the backend as fenced at `token` of `fenceKey` (both null: checks the capability and
 * returns null, registering nothing: what warms a spare backend, session-fence.ts warmSession) (definitions.ts fence_session) with a
 * capability bound to the backend and the call: one row, the fence's highest token (null: no fence).
 */
export function fenceConnection(capability: string, backend: BackendIdentity, fenceKey: string | null, token: bigint | null): string {
  const cap = sessionFenceCapability(capability, backend, fenceKey, token);
  const key = fenceKey === null ? 'NULL' : pg.escapeLiteral(fenceKey);
  return `SET LOCAL synchronous_commit = off; SELECT fencepost_api.fence_session(${pg.escapeLiteral(cap)}, ${key}, ${token === null ? 'NULL' : token.toString()})`;
}
