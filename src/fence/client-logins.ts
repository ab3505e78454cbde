// Logins for client SQL (POST /v1/transactions): the privilege boundary of fenced transactions.
//
// Client SQL never runs as the role that owns the fencepost schema. Each key with a pgRole gets a
// login of its own, `<clientRole>_<key name>`, member of that pgRole and of no other role; in open
// mode there is one login, `<clientRole>` (default `fencepost_client`), with whatever the operator
// granted it. The logins are NOSUPERUSER NOCREATEROLE NOCREATEDB NOREPLICATION NOBYPASSRLS
// NOINHERIT, own nothing, and may only call the proxy's fence functions in schema fencepost_api
// (definitions.ts CLIENT_FUNCTIONS; those that fence demand the proxy's capability). Neither they
// nor the keys' roles may name anything in schema fencepost.
// Whatever a statement does — RESET ROLE, set_config('role', …), SET SESSION
// AUTHORIZATION, DO/EXECUTE, functions — it ends as the login or the key's role: nothing there can
// lower a fence, disable a trigger or reach another key's role.
//
// The proxy (as DATABASE_URL's role) creates them when it may (superuser, or CREATEROLE with ADMIN
// on the pgRoles); otherwise it reports the exact SQL for an operator to run and transactions are
// refused until the logins exist. Passwords are random, kept in fencepost.client_logins (owner
// only), and sent to Postgres as SCRAM verifiers, never in clear.
import { createHash, createHmac, pbkdf2Sync, randomBytes } from 'node:crypto';
import pg from 'pg';
import * as q from './sql/logins.ts';
import { sqlState } from './pg-errors.ts';
import { withClient } from './checkout.ts';
import { DUPLICATE_OBJECT, INSUFFICIENT_PRIVILEGE, INVALID_PASSWORD, UNIQUE_VIOLATION } from './sqlstate.ts';

/** Postgres role names we accept in configuration (also passed as a parameter, never spliced). */
export const ROLE_NAME = /^[A-Za-z_][A-Za-z0-9_$]{0,62}$/;

/** A key that may run transactions, or `null` for open mode. */
export interface LoginSpec {
  keyName: string | null;
  /** The key's pgRole (required for keys; null in open mode). */
  pgRole: string | null;
}

export interface ClientLogin {
  login: string;
  password: string;
  pgRole: string | null;
}

/** Why a login cannot be used, and the SQL an operator may run to fix it (empty when none helps). */
export interface LoginProblem {
  login: string;
  message: string;
  sql: string[];
}

export interface ProvisionResult {
  /** By key name (`null` = open mode). */
  logins: Map<string | null, ClientLogin>;
  problems: Map<string | null, LoginProblem>;
  /** The secret that fence_session's capabilities are made from (fencepost.fence_capability, migration 0004). */
  capability: string;
}

/** The login for a key (`null`: open mode). At most 63 bytes: long names end in a hash. */
export function loginName(clientRole: string, keyName: string | null): string {
  if (keyName === null) return clientRole;
  const name = `${clientRole}_${keyName}`;
  if (Buffer.byteLength(name) <= 63) return name;
  return `${clientRole}_${createHash('sha256').update(keyName).digest('hex').slice(0, 16)}`;
}

/** A SCRAM-SHA-256 verifier for `password`, as Postgres stores it (RFC 5803 form). */
export function scramVerifier(password: string, iterations = 4096): string {
  const salt = randomBytes(16);
  const salted = pbkdf2Sync(password, salt, iterations, 32, 'sha256');
  const clientKey = createHmac('sha256', salted).update('Client Key').digest();
  const storedKey = createHash('sha256').update(clientKey).digest();
  const serverKey = createHmac('sha256', salted).update('Server Key').digest();
  return `SCRAM-SHA-256$${iterations}:${salt.toString('base64')}$${storedKey.toString('base64')}:${serverKey.toString('base64')}`;
}

/**
 * Creates (or checks) the login of every spec, in its own transaction each, under an advisory lock.
 * Never throws for a login that cannot be made: it lands in `problems` with the SQL that fixes it.
 */
export async function provisionClientLogins(owner: pg.Pool, clientRole: string, specs: readonly LoginSpec[]): Promise<ProvisionResult> {
  const logins = new Map<string | null, ClientLogin>();
  const problems = new Map<string | null, LoginProblem>();
  const { rows } = await owner.query<{ secret: string }>(q.capability());
  const capability = rows[0]?.secret;
  if (capability === undefined) throw new Error('fencepost.fence_capability is empty: migration 0004 did not run');
  for (const spec of specs) {
    const login = loginName(clientRole, spec.keyName);
    const outcome = await provisionOne(owner, login, spec.pgRole);
    if ('problem' in outcome) problems.set(spec.keyName, outcome.problem);
    else logins.set(spec.keyName, { login, password: outcome.password, pgRole: spec.pgRole });
  }
  return { logins, problems, capability };
}

async function provisionOne(
  owner: pg.Pool,
  login: string,
  pgRole: string | null,
): Promise<{ password: string } | { problem: LoginProblem }> {
  return await withClient(owner, (client) => provisionOn(client, login, pgRole));
}

async function provisionOn(
  client: pg.PoolClient,
  login: string,
  pgRole: string | null,
): Promise<{ password: string } | { problem: LoginProblem }> {
  const problem = (message: string, sql: string[] = []) => ({ problem: { login, message, sql } });
  let open = false;
  try {
    await client.query('BEGIN');
    open = true;
    // Proxies of this database provisioning at once take turns; `created` is decided under the lock.
    // The turn may take longer than FENCEPOST_LOCK_TIMEOUT_MS (statement_timeout still bounds it):
    // a proxy starting beside another must wait for it, not exit.
    await client.query(q.noLockTimeout());
    await client.query(q.lock());
    const created = (await client.query(q.storePassword(login, randomBytes(24).toString('base64url')))).rowCount === 1;
    const password = (await client.query<{ password: string }>(q.storedPassword(login))).rows[0]!.password;
    const todo: string[] = [];
    const existing = (await client.query<{ unsafe: boolean }>(q.role(login))).rows[0];
    if (existing === undefined) todo.push(q.createLogin(login, scramVerifier(password)));
    else if (created) {
      // Roles are cluster-wide: this one was made by hand or for another database.
      return problem(
        `role ${login} exists but was not created for this database (roles are cluster-wide): drop it, or set FENCEPOST_CLIENT_ROLE to another name`,
      );
    } else if (existing.unsafe) {
      return problem(
        `role ${login} exists with privileges a client login must not have (superuser, createrole, createdb, replication, bypassrls, inherit, or no login): drop it or set FENCEPOST_CLIENT_ROLE to another name`,
      );
    }
    const member = existing === undefined ? [] : (await client.query<{ rolname: string }>(q.memberships(login))).rows.map((r) => r.rolname);
    if (existing !== undefined && ((await client.query(q.hasRoleSettings(login))).rowCount ?? 0) > 0) {
      todo.push(...q.resetRoleSettings(login, (await client.query<{ db: string }>(q.currentDatabase())).rows[0]!.db));
    }
    for (const role of member) if (role !== pgRole) todo.push(q.revokeRole(role, login));
    if (pgRole !== null) {
      if ((await client.query(q.roleExists(pgRole))).rowCount === 0)
        return problem(`pgRole ${pgRole} does not exist: create it and grant it what the key's transactions may do`);
      const reach = (await client.query<{ rolname: string }>(q.dangerousReach(pgRole))).rows.map((r) => r.rolname);
      // A privilege, not a name: whatever path gives the role a fencepost table, it is refused.
      reach.push(
        ...(await client.query<{ relname: string }>(q.fenceTablesReachable(pgRole))).rows.map(
          (r) => `a privilege on fencepost.${r.relname}`,
        ),
      );
      // Naming is enough to queue a DDL lock there that every tenant's fence would wait behind.
      if (((await client.query(q.namesFenceSchema(pgRole))).rowCount ?? 0) > 0)
        reach.push('USAGE on schema fencepost (REVOKE USAGE ON SCHEMA fencepost FROM it)');
      if (reach.length > 0) {
        return problem(
          `pgRole ${pgRole} reaches ${reach.join(', ')} (superuser, createrole, bypassrls, replication, server files or programs, signalling backends, or the owner of the fencepost schema): client SQL would escape the fence; give the key a role without them`,
        );
      }
      if (!member.includes(pgRole)) todo.push(q.grantRole(pgRole, login));
    }
    // A key's login names nothing of schema fencepost (another tenant's fence depends on it); the
    // open mode's one login has whatever the operator granted it (one tenant).
    if (pgRole !== null) todo.push(`REVOKE USAGE ON SCHEMA fencepost FROM ${pg.escapeIdentifier(login)}`);
    todo.push(...q.grantFence(login));
    // The proxy's own role must be able to terminate the login's backends (a transaction past its
    // deadline): membership does it for a role that is not a superuser.
    const owner = (await client.query<{ u: string }>(q.currentUser())).rows[0]!.u;
    if (((await client.query(q.isMember(owner, login))).rowCount ?? 0) === 0)
      todo.push(`GRANT ${pg.escapeIdentifier(login)} TO ${pg.escapeIdentifier(owner)}`);
    // The fence and the seal run after SET LOCAL ROLE: the key's role may call them too (both
    // demand the capability, so no other member of the role can use them).
    if (pgRole !== null) todo.push(...q.grantFence(pgRole));
    await client.query('SAVEPOINT ddl');
    try {
      for (const sql of todo) await client.query(sql);
    } catch (err) {
      const state = sqlState(err);
      if (state === DUPLICATE_OBJECT || state === UNIQUE_VIOLATION) {
        return problem(
          `role ${login} was created at the same time for another database (roles are cluster-wide): set FENCEPOST_CLIENT_ROLE to another name`,
        );
      }
      if (state !== INSUFFICIENT_PRIVILEGE) throw err;
      // Keep the password row, so the SQL below sets the verifier of this very password.
      await client.query('ROLLBACK TO SAVEPOINT ddl');
      await client.query('COMMIT');
      open = false;
      return problem(`DATABASE_URL's role may not create login ${login} (${(err as Error).message}); run as a superuser:`, todo);
    }
    await client.query('COMMIT');
    open = false;
    return { password };
  } finally {
    if (open) await client.query('ROLLBACK').catch(() => {});
  }
}

/**
 * Sets the login's password back to the stored one (a statement of the login itself may have
 * changed it: ALTER ROLE … PASSWORD is allowed on oneself). Throws when that is not allowed either.
 */
export async function resetClientPassword(owner: pg.Pool, login: ClientLogin): Promise<void> {
  await owner.query(q.setPassword(login.login, scramVerifier(login.password)));
}

/**
 * `connect()` as `login`; when Postgres refuses its password (a statement of this login may have
 * changed its own), the password is set back once (with `owner`) and `connect()` tried again.
 */
export async function connectAs<T>(owner: pg.Pool, login: ClientLogin, connect: () => Promise<T>): Promise<T> {
  try {
    return await connect();
  } catch (err) {
    if (sqlState(err) !== INVALID_PASSWORD) throw err;
    await resetClientPassword(owner, login);
    return await connect();
  }
}
