// The embedded cluster's one statement of its own (src/fence/embedded-postgres.ts).
import pg from 'pg';

/** Every session of `role` starts on `public`: its own schema never catches a user's unqualified CREATE. */
export function publicSearchPath(role: string): string {
  return `ALTER ROLE ${pg.escapeIdentifier(role)} SET search_path = public`;
}
