// DATABASE_URL, read the same way by every part of the proxy: with node-postgres's own parser, so
// each form libpq documents works, a Unix socket folder included
// (`postgresql://fencepost:pw@/fencepost?host=/var/run/postgresql`, the usual way to reach a
// Postgres on the same host; WHATWG URL refuses that form), and with node-postgres's defaults for
// what the URL leaves out (PGHOST, PGPORT, PGDATABASE, PGSSLMODE, …), so the SQL endpoint dials
// the server the HTTP door's pools reach, the same way.
//
// A list of hosts (`postgresql://u:pw@db1:5432,db2:5433/fencepost?target_session_attrs=read-write`,
// or `?host=/run/a,/run/b&port=5432,5433`), which node-postgres does not read, is split here: every
// new connection goes to the host primary-finder.ts picks, as libpq would. One host: no finder.
import type { ConnectionOptions } from 'node:tls';
import pg from 'pg';
import { parseIntoClientConfig } from 'pg-connection-string';
import { clientSqlVariant, describeHost, finderFor, type DatabaseHost, type PrimaryFinder, type SessionAttrs } from './primary-finder.ts';

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
  /** A URL with several hosts: the finder that says which one to dial (host and port are the first's). */
  follow?: PrimaryFinder;
}

/**
 * Settings a URL may not make: the proxy sets the timeouts itself (node-postgres would send these
 * as startup parameters, which Postgres applies after `options`), and its connections are never
 * replication connections.
 */
const PROXY_OWNED = ['statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout', 'replication'] as const;

/** libpq's values, and why a writer cannot use the ones it refuses. */
const SESSION_ATTRS: ReadonlySet<string> = new Set(['any', 'read-write', 'primary']);
const NOT_FOR_WRITERS: ReadonlySet<string> = new Set(['read-only', 'standby', 'prefer-standby']);

/** How long a probe of one host may take when the URL sets no connect_timeout. */
const DEFAULT_PROBE_TIMEOUT_MS = 2000;

interface ParsedUrl {
  config: pg.ClientConfig;
  /** Two or more hosts, in the URL's order; null for one (node-postgres resolves it, PGHOST included). */
  hosts: DatabaseHost[] | null;
  attrs: SessionAttrs;
  /** libpq's connect_timeout (seconds) as milliseconds, when set. */
  connectTimeoutMs: number | null;
}

function parsePort(text: string, where: string): number {
  const n = /^\d{1,5}$/.test(text) ? Number(text) : NaN;
  if (!(n >= 1 && n <= 65535)) throw new Error(`${where}: port ${JSON.stringify(text)} is not a number from 1 to 65535`);
  return n;
}

/** `[::1]:5433`, `db:5432`, `db`, `%2Fsockets:6000` → host and port (undefined: the default). */
function splitHostPort(entry: string): { host: string; port: number | undefined } {
  const m = /^\[([^\]]*)\](?::(.*))?$/.exec(entry) ?? /^([^:[\]]*)(?::(.*))?$/.exec(entry);
  if (!m || m[1] === '') throw new Error(`the host list's entry ${JSON.stringify(entry)} is not host[:port]`);
  let host: string;
  try {
    host = decodeURIComponent(m[1]!);
  } catch {
    throw new Error(`the host list's entry ${JSON.stringify(entry)} is not valid percent-encoding`);
  }
  return { host, port: m[2] === undefined || m[2] === '' ? undefined : parsePort(m[2], `the host list's entry ${JSON.stringify(entry)}`) };
}

/** The URL's query parameters, decoded as node-postgres's parser decodes them. */
function queryOf(databaseUrl: string): URLSearchParams {
  const q = databaseUrl.indexOf('?');
  return new URLSearchParams(q < 0 ? '' : databaseUrl.slice(q + 1).split('#')[0]);
}

/**
 * The authority's hosts when it lists more than one, and the URL with only the first left for
 * node-postgres's parser (which reads credentials, database and parameters).
 */
function authorityHosts(databaseUrl: string): { url: string; hosts: { host: string; port: number | undefined }[] } | null {
  const m = /^(postgres(?:ql)?:\/\/)([^/?#]*)(.*)$/s.exec(databaseUrl);
  if (!m) return null;
  const authority = m[2]!;
  const at = authority.lastIndexOf('@');
  const spec = authority.slice(at + 1);
  if (!spec.includes(',')) return null;
  const entries = spec.split(',');
  return { url: `${m[1]}${authority.slice(0, at + 1)}${entries[0]}${m[3]}`, hosts: entries.map(splitHostPort) };
}

/** The URL parsed, minus what the proxy owns. Throws on a NUL, which would smuggle startup parameters in. */
function parse(databaseUrl: string): ParsedUrl {
  const fromAuthority = authorityHosts(databaseUrl);
  const c = parseIntoClientConfig(fromAuthority?.url ?? databaseUrl) as pg.ClientConfig & Record<string, unknown>;
  for (const [k, v] of Object.entries(c)) {
    if (typeof v === 'string' && v.includes('\u0000')) throw new Error(`its ${k} holds a NUL character`);
  }
  for (const k of PROXY_OWNED) delete c[k];
  const attrs = typeof c.target_session_attrs === 'string' ? c.target_session_attrs : 'any';
  if (NOT_FOR_WRITERS.has(attrs))
    throw new Error(`target_session_attrs=${attrs} picks a server that takes no writes: use read-write or primary`);
  if (!SESSION_ATTRS.has(attrs)) throw new Error(`target_session_attrs=${JSON.stringify(attrs)} is not one of any, read-write, primary`);
  const balance = c.load_balance_hosts;
  if (balance !== undefined && balance !== 'disable')
    throw new Error(`load_balance_hosts=${JSON.stringify(balance)} is not supported: the hosts are tried in the URL's order (disable)`);
  const timeout = c.connect_timeout;
  let connectTimeoutMs: number | null = null;
  if (typeof timeout === 'string' && timeout !== '') {
    if (!/^\d+$/.test(timeout)) throw new Error(`connect_timeout=${JSON.stringify(timeout)} is not a whole number of seconds`);
    // libpq: values below 2 s count as 2 s; 0 is "wait forever", which a probe must not.
    connectTimeoutMs = Number(timeout) === 0 ? null : Math.max(2, Number(timeout)) * 1000;
  }
  delete c.target_session_attrs;
  delete c.load_balance_hosts;

  // Hosts from the authority (each with its own port) or from `host=` (ports from `port=`).
  const query = queryOf(databaseUrl);
  const paramHosts = query.get('host')?.includes(',') ? query.get('host')!.split(',') : null;
  const paramPorts = query.get('port')?.includes(',') ? query.get('port')!.split(',') : null;
  let hosts: DatabaseHost[] | null = null;
  const defaultPort = () => Number(process.env.PGPORT || pg.defaults.port || 5432);
  if (fromAuthority) {
    if (query.has('host')) throw new Error('give the hosts either in the URL (host1:port1,host2:port2) or in host=, not both');
    if (query.has('port'))
      throw new Error('with a host list in the URL, give each host its port there (host1:port1,host2:port2), not in port=');
    hosts = fromAuthority.hosts.map((h) => ({ host: h.host, port: h.port ?? defaultPort() }));
  } else if (paramHosts) {
    if (paramHosts.some((h) => h.trim() === '')) throw new Error('host= lists an empty host');
    if (paramPorts && paramPorts.length !== paramHosts.length)
      throw new Error(`host= lists ${paramHosts.length} hosts but port= ${paramPorts.length} ports: give one port, or one per host`);
    const one = query.get('port');
    const ports = paramPorts
      ? paramPorts.map((p) => parsePort(p.trim(), 'port='))
      : paramHosts.map(() => (one === null || one === '' ? defaultPort() : parsePort(one, 'port=')));
    hosts = paramHosts.map((h, i) => ({ host: h.trim(), port: ports[i]! }));
  } else if (paramPorts) {
    throw new Error(`port= lists ${paramPorts.length} ports for one host`);
  }
  if (hosts) {
    c.host = hosts[0]!.host;
    c.port = hosts[0]!.port;
  }
  return { config: c, hosts, attrs: attrs as SessionAttrs, connectTimeoutMs };
}

function parseUrl(databaseUrl: string): pg.ClientConfig {
  return parse(databaseUrl).config;
}

/** The finder of a URL with several hosts (one per URL in the process); null for one host. */
export function primaryFinder(databaseUrl: string): PrimaryFinder | null {
  const p = parse(databaseUrl);
  if (p.hosts === null) return null;
  const hosts = p.hosts;
  return finderFor(databaseUrl, () => ({
    hosts,
    attrs: p.attrs,
    probe: p.config,
    probeTimeoutMs: p.connectTimeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS,
  }));
}

/** Refuses a DATABASE_URL the proxy cannot use as it is (loadConfig names the setting). */
export function checkDatabaseUrl(databaseUrl: string): void {
  parse(databaseUrl);
}

export function databaseTarget(databaseUrl: string): DatabaseTarget {
  // node-postgres's own resolution: the URL, then the PG* environment, then its defaults.
  const p = (
    new pg.Client(parseUrl(databaseUrl)) as unknown as {
      connectionParameters: {
        host: string;
        port: number;
        database: string | undefined;
        ssl: boolean | ConnectionOptions | undefined;
        sslnegotiation: string | undefined;
      };
    }
  ).connectionParameters;
  const follow = primaryFinder(databaseUrl);
  if (p.sslnegotiation === 'direct')
    throw new Error('sslnegotiation=direct is not supported: the SQL endpoint opens TLS to Postgres with an SSLRequest');
  const ssl = p.ssl;
  return {
    host: p.host || 'localhost',
    port: Number(p.port || 5432),
    database: p.database ?? '',
    // node-postgres hides the client key from a spread.
    tls: ssl === undefined || ssl === false ? null : ssl === true ? {} : { ...ssl, ...(ssl.key !== undefined ? { key: ssl.key } : {}) },
    ...(follow ? { follow } : {}),
  };
}

/** `host:port`, or the socket file, for messages (never the password); every host of a list. */
export function describeTarget(t: Pick<DatabaseTarget, 'host' | 'port' | 'follow'>): string {
  return t.follow ? t.follow.opts.hosts.map(describeHost).join(', ') : describeHost(t);
}

/** What clientConfig takes from a pool's settings: where and how to connect, not pool sizes or timeouts. */
const CONNECTION_FIELDS = [
  'Client',
  'connectionString',
  'host',
  'port',
  'database',
  'user',
  'password',
  'ssl',
  'options',
  'keepAlive',
  'keepAliveInitialDelayMillis',
  'client_encoding',
] as const;

/** node-postgres settings, and for a URL with several hosts the Client that follows its primary (pg.Pool takes it as `Client`). */
export type ConnectionConfig = pg.ClientConfig & { Client?: typeof pg.Client };

/**
 * node-postgres settings for `database` (a URL, or a pool's own settings), logged in as `login`
 * when given. `options` go after the URL's own `options`: Postgres applies the last `-c` of a
 * setting, so a URL cannot switch off what the proxy sets (synchronous_commit, timeouts). Handing
 * node-postgres a URL would do the opposite: its values override every explicit setting.
 */
export function clientConfig(
  database: string | (pg.ClientConfig & { Client?: unknown }),
  over: { login?: { user: string; password: string }; options?: string } = {},
): ConnectionConfig {
  let base: ConnectionConfig;
  if (typeof database === 'string') {
    base = parseUrl(database);
    const follow = primaryFinder(database);
    if (follow) base.Client = follow.Client;
  } else {
    base = Object.fromEntries(CONNECTION_FIELDS.filter((f) => database[f] !== undefined).map((f) => [f, database[f]])) as ConnectionConfig;
    if (base.connectionString) base = { ...base, ...clientConfig(base.connectionString) };
  }
  delete base.connectionString;
  // A login's connections run client SQL: what its statements raise does not move the finder.
  if (over.login && base.Client) base.Client = clientSqlVariant(base.Client);
  const options = [base.options, over.options].filter((o) => o !== undefined && o !== '').join(' ');
  return {
    ...base,
    ...(over.login ? { user: over.login.user, password: over.login.password } : {}),
    ...(options !== '' ? { options } : {}),
  };
}
