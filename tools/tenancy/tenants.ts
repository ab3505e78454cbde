// Two tenants on one proxy and one Postgres, set up as docs/security.md's tenancy model asks of an
// operator: each tenant a writer key with its own fence-key prefix and pgRole, its tables in a
// schema only its pgRole has USAGE on, owned by a role no writer has, and protected by its fence
// key. Tenant A ("orders-writer", orders/) also has a direct Postgres login that is a member of its
// pgRole ("anything a writer can log in as"), with a connection limit.
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { protectTable } from '../../src/fence/protect.ts';

export interface Tenant {
  /** The key's name (the SQL endpoint's user name). */
  key: string;
  secret: string;
  prefix: string;
  /** The fence key the tenant's leader writes under. */
  fenceKey: string;
  pgRole: string;
  /** Its protected table, schema-qualified. */
  table: string;
  schema: string;
}

export interface Tenants {
  a: Tenant;
  b: Tenant;
  /** A's direct Postgres login (a member of A's pgRole), its password and connection limit. */
  direct: { login: string; password: string; connectionLimit: number };
  /** FENCEPOST_KEYS for the proxy. */
  keysJson: string;
}

export const DIRECT_CONNECTION_LIMIT = 8;

/** Role names for a run: roles are cluster-wide, so each run's are its own. */
export function tenantNames(): Tenants {
  const tag = randomBytes(3).toString('hex');
  const a: Tenant = {
    key: 'orders-writer',
    secret: `orders-secret-${randomBytes(8).toString('hex')}`,
    prefix: 'orders/',
    fenceKey: 'orders/main',
    pgRole: `fp_ten_orders_${tag}`,
    table: 'orders.items',
    schema: 'orders',
  };
  const b: Tenant = {
    key: 'billing-writer',
    secret: `billing-secret-${randomBytes(8).toString('hex')}`,
    prefix: 'billing/',
    fenceKey: 'billing/main',
    pgRole: `fp_ten_billing_${tag}`,
    table: 'billing.ledger',
    schema: 'billing',
  };
  const keysJson = JSON.stringify({
    keys: [a, b].map((t) => ({ name: t.key, secret: t.secret, fenceKeyPrefixes: [t.prefix], pgRole: t.pgRole })),
  });
  return {
    a,
    b,
    direct: { login: `fp_ten_direct_${tag}`, password: randomBytes(12).toString('hex'), connectionLimit: DIRECT_CONNECTION_LIMIT },
    keysJson,
  };
}

const owner = (t: Tenant) => `${t.pgRole}_owner`;

/**
 * The roles (before the proxy starts: it checks each pgRole) — run as a superuser on the database
 * the proxy serves.
 */
export async function createTenantRoles(admin: pg.Pool, t: Tenants): Promise<void> {
  for (const tenant of [t.a, t.b]) {
    await admin.query(`CREATE ROLE ${tenant.pgRole} NOLOGIN; CREATE ROLE ${owner(tenant)} NOLOGIN`);
  }
  await admin.query(
    `CREATE ROLE ${t.direct.login} LOGIN CONNECTION LIMIT ${t.direct.connectionLimit} PASSWORD '${t.direct.password}'; GRANT ${t.a.pgRole} TO ${t.direct.login}`,
  );
  // INHERIT: the login has its pgRole's privileges without SET ROLE, the most a writer's login could.
}

/** The tenants' schemas and protected tables (after migrate). */
export async function createTenantTables(admin: pg.Pool, t: Tenants): Promise<void> {
  for (const tenant of [t.a, t.b]) {
    await admin.query(`CREATE SCHEMA ${tenant.schema} AUTHORIZATION ${owner(tenant)};
      CREATE TABLE ${tenant.table} (id bigserial PRIMARY KEY, v text NOT NULL);
      ALTER TABLE ${tenant.table} OWNER TO ${owner(tenant)};
      GRANT USAGE ON SCHEMA ${tenant.schema} TO ${tenant.pgRole};
      GRANT SELECT, INSERT, UPDATE, DELETE ON ${tenant.table} TO ${tenant.pgRole};
      GRANT USAGE ON SEQUENCE ${tenant.table}_id_seq TO ${tenant.pgRole}`);
    await protectTable(admin, tenant.table, tenant.fenceKey);
  }
}

export async function dropTenantRoles(admin: pg.Pool, t: Tenants): Promise<void> {
  for (const r of [t.direct.login, t.a.pgRole, t.b.pgRole, owner(t.a), owner(t.b)]) {
    await admin.query(`DROP OWNED BY ${r} CASCADE`).catch(() => {});
    await admin.query(`DROP ROLE IF EXISTS ${r}`).catch(() => {});
  }
}

/** Where the tenants reach the proxy and the database. */
export interface Endpoints {
  /** The proxy's HTTP base URL. */
  http: string;
  pgwirePort: number;
  database: string;
  /** A superuser URL of the database the proxy serves (setup, checks, and to find A's backends). */
  adminUrl: string;
}

export function sqlDoorClient(e: Endpoints, t: Tenant, options?: string): pg.Client {
  const c = new pg.Client({
    host: '127.0.0.1',
    port: e.pgwirePort,
    database: e.database,
    user: t.key,
    password: t.secret,
    ...(options === undefined ? {} : { options }),
  });
  c.on('error', () => {});
  return c;
}

export function directClient(e: Endpoints, t: Tenants): pg.Client {
  const u = new URL(e.adminUrl);
  const c = new pg.Client({
    host: u.hostname,
    port: Number(u.port || 5432),
    database: u.pathname.slice(1),
    user: t.direct.login,
    password: t.direct.password,
  });
  c.on('error', () => {});
  return c;
}

export function fenceOptions(token: bigint | number, fenceKey: string): string {
  return `-c fencepost.token=${token} -c fencepost.fence_key=${fenceKey}`;
}

/** HTTP to the proxy as `t`; resolves with status, body text and how long it took. */
export async function http(
  e: Endpoints,
  t: Tenant,
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body?: string | Buffer,
  signal?: AbortSignal,
): Promise<{ status: number; text: string; ms: number }> {
  const started = performance.now();
  const r = await fetch(`${e.http}${path}`, {
    method,
    headers: { authorization: `Bearer ${t.secret}`, ...headers },
    ...(body === undefined ? {} : { body }),
    ...(signal ? { signal } : {}),
  });
  const text = await r.text();
  return { status: r.status, text, ms: performance.now() - started };
}

/** The registry code of an HTTP error body (`{"error":"stale_token",…}`), or the status alone. */
export function httpCode(r: { status: number; text: string }): string {
  try {
    const j = JSON.parse(r.text) as { error?: unknown; code?: unknown; sqlState?: unknown };
    const code = typeof j.error === 'string' ? j.error : typeof j.code === 'string' ? j.code : null;
    const state = typeof j.sqlState === 'string' ? `/${j.sqlState}` : '';
    return code === null ? String(r.status) : `${r.status} ${code}${state}`;
  } catch {
    return String(r.status);
  }
}

/** The backends of tenant A (its key's login and its direct login), from the admin's pg_stat_activity. */
export async function tenantABackends(admin: pg.Pool, t: Tenants): Promise<number[]> {
  const { rows } = await admin.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND usename IS NOT NULL
       AND (usename = $2 OR (usename <> current_user AND pg_has_role(usename, $1, 'MEMBER') AND NOT pg_has_role(usename, $3, 'MEMBER')))`,
    [t.a.pgRole, t.direct.login, t.b.pgRole],
  );
  return rows.map((r) => r.pid);
}
