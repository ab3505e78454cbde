// The client logins' statements (client-logins.ts): provisioning under an advisory lock, the
// checks that keep a login and a key's role boxed in, and the role DDL. Role DDL takes no
// parameters: names are quoted with escapeIdentifier, verifiers with escapeLiteral.
import pg from 'pg';
import type { Query } from './query.ts';
import { CLIENT_FUNCTIONS, CLIENT_SCHEMA } from '../definitions.ts';

/** The advisory lock under which the instances of one database provision in turn (next to migrate.ts's). */
export const PROVISIONING_LOCK_KEY = 4_669_143_214_093_122n;

// Predefined roles that reach the server itself or other sessions, or write past triggers: a
// pgRole must not lead to them. pg_create_subscription (Postgres 16+): a subscription's apply
// worker writes with session_replication_role = replica, under which the protect trigger does not
// fire. Names a server does not have match no role.
export const DANGEROUS_BUILTIN_ROLES = [
  'pg_execute_server_program',
  'pg_write_server_files',
  'pg_read_server_files',
  'pg_signal_backend',
  'pg_read_all_data',
  'pg_write_all_data',
  'pg_maintain',
  'pg_create_subscription',
];

export const lock = (): Query => ({ text: 'SELECT pg_advisory_xact_lock($1)', values: [PROVISIONING_LOCK_KEY.toString()] });
/** The pool's lock_timeout bounds writes; waiting for another instance's provisioning is no write. */
export const noLockTimeout = (): Query => ({ text: 'SET LOCAL lock_timeout = 0' });
export const storedPassword = (login: string): Query => ({
  name: 'fencepost_client_password',
  text: 'SELECT password FROM fencepost.client_logins WHERE login = $1',
  values: [login],
});
export const storePassword = (login: string, password: string): Query => ({
  text: 'INSERT INTO fencepost.client_logins (login, password) VALUES ($1, $2) ON CONFLICT (login) DO NOTHING',
  values: [login, password],
});
export const capability = (): Query => ({ text: 'SELECT secret FROM fencepost.fence_capability' });
export const role = (name: string): Query => ({
  text: `SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls OR rolinherit OR NOT rolcanlogin AS unsafe
         FROM pg_roles WHERE rolname = $1`,
  values: [name],
});
export const memberships = (login: string): Query => ({
  text: `SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles l ON l.oid = m.member WHERE l.rolname = $1`,
  values: [login],
});
/** Roles reachable from `pgRole` (SET ROLE through memberships) that would escape the box. */
export const dangerousReach = (pgRole: string): Query => ({
  text: `SELECT r.rolname FROM pg_roles r
         WHERE pg_has_role($1, r.oid, 'MEMBER')
           AND (r.rolsuper OR r.rolcreaterole OR r.rolbypassrls OR r.rolreplication OR r.rolname = ANY($2::text[])
                OR r.oid = (SELECT relowner FROM pg_class WHERE oid = 'fencepost.fences'::regclass)
                OR r.oid = (SELECT nspowner FROM pg_namespace WHERE nspname = 'fencepost'))`,
  values: [pgRole, DANGEROUS_BUILTIN_ROLES],
});
/** Relations of the fencepost schema `role` may touch by any privilege (directly or inherited). */
export const fenceTablesReachable = (role: string): Query => ({
  text: `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'fencepost' AND c.relkind IN ('r', 'v', 'm', 'p')
           AND has_table_privilege($1, c.oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER')`,
  values: [role],
});
export const currentDatabase = (): Query => ({ text: 'SELECT current_database() AS db' });
export const currentUser = (): Query => ({ text: 'SELECT current_user AS u' });
/** `member` is a member of `role` with INHERIT (what pg_terminate_backend asks of a non-superuser). */
export const isMember = (member: string, role: string): Query => ({
  text: `SELECT 1 FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles u ON u.oid = m.member WHERE r.rolname = $2 AND u.rolname = $1`,
  values: [member, role],
});
export const hasRoleSettings = (login: string): Query => ({
  text: 'SELECT 1 FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole WHERE r.rolname = $1',
  values: [login],
});
/** Role settings a login may have given itself (ALTER ROLE CURRENT_USER SET …): gone at each start. */
export const resetRoleSettings = (login: string, db: string): string[] => [
  `ALTER ROLE ${pg.escapeIdentifier(login)} RESET ALL`,
  `ALTER ROLE ${pg.escapeIdentifier(login)} IN DATABASE ${pg.escapeIdentifier(db)} RESET ALL`,
];
export const roleExists = (name: string): Query => ({ text: 'SELECT 1 FROM pg_roles WHERE rolname = $1', values: [name] });
export const createLogin = (login: string, verifier: string): string =>
  `CREATE ROLE ${pg.escapeIdentifier(login)} LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB NOREPLICATION NOBYPASSRLS NOINHERIT PASSWORD ${pg.escapeLiteral(verifier)}`;
export const setPassword = (login: string, verifier: string): string =>
  `ALTER ROLE ${pg.escapeIdentifier(login)} PASSWORD ${pg.escapeLiteral(verifier)}`;
export const grantRole = (pgRole: string, login: string): string => `GRANT ${pg.escapeIdentifier(pgRole)} TO ${pg.escapeIdentifier(login)}`;
export const revokeRole = (role: string, login: string): string => `REVOKE ${pg.escapeIdentifier(role)} FROM ${pg.escapeIdentifier(login)}`;
/** What a login (and a key's role: the fence runs after SET LOCAL ROLE) may use of the schema. */
export const grantFence = (role: string): string[] => [
  `GRANT USAGE ON SCHEMA ${CLIENT_SCHEMA} TO ${pg.escapeIdentifier(role)}`,
  ...CLIENT_FUNCTIONS.map((f) => `GRANT EXECUTE ON ROUTINE ${f} TO ${pg.escapeIdentifier(role)}`),
];
/** Whether `role` may name what is in schema fencepost (USAGE, its own or inherited). */
export const namesFenceSchema = (role: string): Query => ({
  text: "SELECT 1 WHERE has_schema_privilege($1, 'fencepost', 'USAGE')",
  values: [role],
});
