// DATABASE_URL, read the same way by every part of the proxy: with node-postgres's own parser, so
// each form libpq documents works, a Unix socket folder included
// (`postgresql://fencepost:pw@/fencepost?host=/var/run/postgresql`, the usual way to reach a
// Postgres on the same host). WHATWG URL refuses that form (credentials without a host).
import type { ConnectionOptions } from 'node:tls';
import type pg from 'pg';
import { parseIntoClientConfig } from 'pg-connection-string';

/** Where a database lives, as the SQL endpoint dials it. */
export interface DatabaseTarget {
  /** A host name or address; a value starting with `/` is a Unix socket folder. */
  host: string;
  port: number;
  database: string;
  /**
   * TLS to the database, as node-postgres reads the URL (sslmode, sslrootcert, sslcert, sslkey):
   * null for none; else the tls.connect options. node-postgres verifies the certificate and host
   * name for every sslmode from prefer up (only `no-verify` does not), and refuses a server
   * without TLS; the SQL endpoint does the same, so both doors reach the database alike.
   */
  tls: ConnectionOptions | null;
}

export function databaseTarget(databaseUrl: string): DatabaseTarget {
  const c = parseIntoClientConfig(databaseUrl);
  return {
    host: c.host || 'localhost',
    port: Number(c.port || 5432),
    database: c.database || c.user || '',
    tls: c.ssl === undefined || c.ssl === false ? null : c.ssl === true ? {} : { ...(c.ssl as ConnectionOptions) },
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
  if (typeof database === 'string') base = parseIntoClientConfig(database);
  else {
    base = Object.fromEntries(CONNECTION_FIELDS.filter((f) => database[f] !== undefined).map((f) => [f, database[f]])) as pg.ClientConfig;
    if (base.connectionString) base = { ...base, ...parseIntoClientConfig(base.connectionString) };
  }
  delete base.connectionString;
  const options = [base.options, over.options].filter((o) => o !== undefined && o !== '').join(' ');
  return {
    ...base,
    ...(over.login ? { user: over.login.user, password: over.login.password } : {}),
    ...(options !== '' ? { options } : {}),
  };
}
