// The session reset of a pooled client-login connection (POST /v1/transactions), a transaction of
// its own committed before the fenced one begins (so a fenced transaction that rolls back leaves
// the session reset, and the fenced one's isolation level still applies: several of these take a
// snapshot). Nothing an earlier transaction left reaches the writer's statements: settings, role,
// prepared statements, cursors, listens, advisory locks, temp tables (but the fence's own, see
// definitions.ts discard_temp). Not sequences: DISCARD SEQUENCES would unfence the session (rule.ts);
// the runner unfences a connection before it serves another set of fences (sql/transactions.ts
// unfenceSession), and a login serves one key only. DISCARD ALL would do both.

export const RESET_SESSION = `BEGIN; RESET ALL; SET SESSION AUTHORIZATION DEFAULT; DEALLOCATE ALL; CLOSE ALL; UNLISTEN *; SELECT pg_catalog.pg_advisory_unlock_all(); SELECT fencepost_api.discard_temp(); COMMIT; `;
