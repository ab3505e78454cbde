// DATABASE_URL, read the same way by every part of the proxy: with node-postgres's own parser, so
// each form libpq documents works, a Unix socket folder included
// (`postgresql://fencepost:pw@/fencepost?host=/var/run/postgresql`, the usual way to reach a
// Postgres on the same host; WHATWG URL refuses that form), and with node-postgres's defaults for
// what the URL leaves out (PGHOST, PGPORT, PGDATABASE, PGSSLMODE, …), so the SQL endpoint dials
// the server the HTTP door's pools reach, the same way.
import type { ConnectionOptions } from 'node:tls';
import pg from 'pg';
import { parseIntoClientConfig } from 'pg-connection-string';

/** Where a database lives, as the SQL endpoint dials it. */
export interface DatabaseTarget {
  /** A host name or address; a value starting with `/` is a Unix socket folder. */
  host: string;
  port: number;
  database: string;
  /**
   * TLS to the database, as node-postgres reads the URL (sslmode, sslrootcert, sslcert, sslkey)
   * or PGSSLMODE: null for none; else the tls.connect options. node-postgres verifies the
   * certificate and host name for every sslmode from prefer up (only `no-verify` does not), and
   * refuses a server without TLS; the SQL endpoint does the same, so both doors reach the database
   * alike.
   */
  tls: ConnectionOptions | null;
}

/**
 * Settings a URL may not make: the proxy sets the timeouts itself (node-postgres would send these
 * as startup parameters, which Postgres applies after `options`), and its connections are never
 * replication connections.
 */
const PROXY_OWNED = ['statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout', 'replication'] as const;

/** The URL parsed, minus what the proxy owns. Throws on a NUL, which would smuggle startup parameters in. */
function parseUrl(databaseUrl: string): pg.ClientConfig {
  const c = parseIntoClientConfig(databaseUrl) as pg.ClientConfig & Record<string, unknown>;
  for (const [k, v] of Object.entries(c)) {
    if (typeof v === 'string' && v.includes('\u0000')) throw new Error(`its ${k} holds a NUL character`);
  }
  for (const k of PROXY_OWNED) delete c[k];
  return c;
}

/** Refuses a DATABASE_URL the proxy cannot use as it is (loadConfig names the setting). */
export function checkDatabaseUrl(databaseUrl: string): void {
  parseUrl(databaseUrl);
}

export function databaseTarget(databaseUrl: string): DatabaseTarget {
  // node-postgres's own resolution: the URL, then the PG* environment, then its defaults.
  const p = (new pg.Client(parseUrl(databaseUrl)) as unknown as {
    connectionParameters: { host: string; port: number; database: string | undefined; ssl: boolean | ConnectionOptions | undefined; sslnegotiation: string | undefined };
  }).connectionParameters;
  if (p.sslnegotiation === 'direct') throw new Error('sslnegotiation=direct is not supported: the SQL endpoint opens TLS to Postgres with an SSLRequest');
  const ssl = p.ssl;
  return {
    host: p.host || 'localhost',
    port: Number(p.port || 5432),
    database: p.database ?? '',
    // node-postgres hides the client key from a spread.
    tls: ssl === undefined || ssl === false ? null : ssl === true ? {} : { ...ssl, ...(ssl.key !== undefined ? { key: ssl.key } : {}) },
  };
}

/** `host:port`, or the socket file, for messages (never the password). */
export function describeTarget(t: Pick<DatabaseTarget, 'host' | 'port'>): string {
  return t.host.startsWith('/') ? `${t.host}/.s.PGSQL.${t.port}` : `${t.host.includes(':') ? `[${t.host}]` : t.host}:${t.port}`;
}

/** What clientConfig takes from a pool's settings: where and how to connect, not pool sizes or timeouts. */
const CONNECTION_FIELDS = ['connectionString', 'host', 'port', 'database', 'user', 'password', 'ssl', 'options', 'keepAlive', 'keepAliveInitialDelayMillis', 'client_encoding'] as const;

/**
 * node-postgres settings for `database` (a URL, or a pool's own settings), logged in as `login`
 * when given. `options` go after the URL's own `options`: Postgres applies the last `-c` of a
 * setting, so a URL cannot switch off what the proxy sets (synchronous_commit, timeouts). Handing
 * node-postgres a URL would do the opposite: its values override every explicit setting.
 */
export function clientConfig(database: string | pg.ClientConfig, over: { login?: { user: string; password: string }; options?: string } = {}): pg.ClientConfig {
  let base: pg.ClientConfig;
  if (typeof database === 'string') base = parseUrl(database);
  else {
    base = Object.fromEntries(CONNECTION_FIELDS.filter((f) => database[f] !== undefined).map((f) => [f, database[f]])) as pg.ClientConfig;
    if (base.connectionString) base = { ...base, ...parseUrl(base.connectionString) };
  }
  delete base.connectionString;
  const options = [base.options, over.options].filter((o) => o !== undefined && o !== '').join(' ');
  return {
    ...base,
    ...(over.login ? { user: over.login.user, password: over.login.password } : {}),
    ...(options !== '' ? { options } : {}),
  };
}
