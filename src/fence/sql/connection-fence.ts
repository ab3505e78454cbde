// The SQL endpoint's two statements of its own on a writer's backend, both before the writer hears
// that its session is ready (session-fence.ts), each a simple Query in a transaction of its
// own: nothing is sent into the session after them. Committed locally: a catalog write of the
// session's (its temporary sequence) and its registration, not a fence raise (raise.ts), so they
// never wait for a synchronous standby. Everything spliced is the proxy's own or a literal.
import pg from 'pg';
import { sessionFenceCapability, type BackendIdentity } from './rule.ts';

/** The backend's setup (definitions.ts session_start): one row, the backend's start. */
export function connectionSetup(): string {
  return 'SET LOCAL synchronous_commit = local; SELECT fencepost_api.session_start()';
}

/**
 * Registers the backend as fenced at `token` of `fenceKey` (definitions.ts fence_session) with a
 * capability bound to the backend and the call: one row, the fence's highest token (null: no fence).
 */
export function fenceConnection(capability: string, backend: BackendIdentity, fenceKey: string, token: bigint): string {
  const cap = sessionFenceCapability(capability, backend, fenceKey, token);
  return `SET LOCAL synchronous_commit = local; SELECT fencepost_api.fence_session(${pg.escapeLiteral(cap)}, ${pg.escapeLiteral(fenceKey)}, ${token.toString()})`;
}
