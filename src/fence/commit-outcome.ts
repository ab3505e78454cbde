// When the fate of a commit is not known. Once a write statement (an autocommit write commits at
// its end) or a COMMIT is sent, only Postgres's answer says whether it committed: a connection
// lost, or a client-side query timeout, before that answer leaves it unknown. So does a commit
// Postgres answered with a WARNING: cancelled or terminated while waiting for a synchronous
// standby, Postgres warns "The transaction has already committed locally, but might not have been
// replicated to the standby" and then reports success (cancel) or closes (terminate). Committed
// on the primary, but a failover to that standby can lose it: never a 200.
import type pg from 'pg';
import type { NoticeMessage } from 'pg-protocol/dist/messages.js';
import { ADMIN_SHUTDOWN, WARNING } from './sqlstate.ts';
import { WriteOutcomeUnknownError } from './errors.ts';

/** SQLSTATEs of the WARNINGs Postgres sends when a wait for the synchronous standby ends without it (syncrep.c). */
const SYNC_REP_WARNING_CODES: ReadonlySet<string> = new Set([
  WARNING, // warning: the wait was cancelled (pg_cancel_backend, statement cancel)
  ADMIN_SHUTDOWN, // admin_shutdown: the backend was terminated while waiting
]);

/**
 * Watches `client` while a commit is in flight: `check()` after the answer throws a
 * WriteOutcomeUnknownError when a WARNING of those codes came meanwhile (a deferred trigger's RAISE
 * WARNING inside COMMIT counts too: the answer then errs on the side of "read back").
 */
export function watchCommit(client: pg.ClientBase): { check(): void; stop(): void } {
  let warning: NoticeMessage | null = null;
  const onNotice = (n: NoticeMessage) => {
    if (warning === null && n.severity === 'WARNING' && n.code !== undefined && SYNC_REP_WARNING_CODES.has(n.code)) warning = n;
  };
  client.on('notice', onNotice);
  return {
    check: () => {
      const w = warning;
      if (w === null) return;
      throw new WriteOutcomeUnknownError(
        w,
        `Postgres committed on the primary but warned "${w.message}"${w.detail ? ` (${w.detail})` : ''}: the synchronous standby may not have it, a failover may lose it`,
      );
    },
    stop: () => {
      client.off('notice', onNotice);
    },
  };
}
