// The session reset of a pooled client-login connection (POST /v1/transactions), a transaction of
// its own committed before the fenced one begins (so a fenced transaction that rolls back leaves
// the session reset, and the fenced one's isolation level still applies: several of these take a
// snapshot). Nothing an earlier transaction left reaches the writer's statements: settings, role,
// prepared statements, cursors, listens, advisory locks, temp tables (but the fence's own, see
// definitions.ts discard_temp), sequences. DISCARD ALL would
// also drop the plans the fence function cached.

/** How the reset starts: fence_transaction_bound() runs only in a Query that starts so (definitions.ts). */
export const RESET_SESSION_HEAD = 'BEGIN; RESET ALL; SET SESSION AUTHORIZATION DEFAULT; ';

export const RESET_SESSION = `${RESET_SESSION_HEAD}DEALLOCATE ALL; CLOSE ALL; UNLISTEN *; SELECT pg_catalog.pg_advisory_unlock_all(); SELECT fencepost.discard_temp(); DISCARD SEQUENCES; COMMIT; `;
