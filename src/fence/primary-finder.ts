// Which of DATABASE_URL's hosts new connections go to when it lists several
// (`postgresql://u:pw@db1:5432,db2:5432/fencepost?target_session_attrs=read-write`), picked the
// way libpq picks: the first host, in the URL's order, that accepts a connection and matches
// target_session_attrs (`any`: it connects; `primary`: not in recovery; `read-write`: not in
// recovery and not default_transaction_read_only). Hosts are probed at once, each on a connection
// of its own, and the answer is taken in order, so a host that does not answer delays the choice by
// its connect timeout only when it comes first.
//
// The host found stays the target until a connection to it fails (refused, reset, admin shutdown,
// 25006 read-only, …): then the next connection searches again. Only the proxy's own observations
// count: on connections that run client SQL (ClientSql: /v1/transactions' logins) no ErrorResponse
// moves anything (a client can RAISE any SQLSTATE); the connection ending does, as a server that
// really ends the session ends it. A search that found nothing is reused for
// SEARCH_FAILURE_REUSE_MS, so a burst of writes during a failover costs one search, not one per
// write, and each of them answers 503 with the reason.
import { EventEmitter } from 'node:events';
import pg from 'pg';
import { writability } from './sql/health.ts';
import { sqlState } from './pg-errors.ts';
import { ADMIN_SHUTDOWN, CANNOT_CONNECT_NOW, CRASH_SHUTDOWN, PROTOCOL_VIOLATION, READ_ONLY_SQL_TRANSACTION } from './sqlstate.ts';
import { NoWritableHostError } from './errors.ts';

/** target_session_attrs values that make sense for a writer. */
export type SessionAttrs = 'any' | 'read-write' | 'primary';

export interface DatabaseHost {
  /** A host name or address; a value starting with `/` is a Unix socket folder. */
  readonly host: string;
  readonly port: number;
}

/** How long a search that found no host answers from memory before the next one starts. */
export const SEARCH_FAILURE_REUSE_MS = 250;

/** `host:port`, or the socket file, for messages. */
export function describeHost(h: DatabaseHost): string {
  return h.host.startsWith('/') ? `${h.host}/.s.PGSQL.${h.port}` : `${h.host.includes(':') ? `[${h.host}]` : h.host}:${h.port}`;
}

function sameHost(a: DatabaseHost | null, b: DatabaseHost | null): boolean {
  return a !== null && b !== null && a.host === b.host && a.port === b.port;
}

function firstLine(err: unknown): string {
  const message = err instanceof Error ? err.message || (err instanceof AggregateError ? String(err.errors[0]) : err.name) : String(err);
  return message.split('\n')[0]!;
}

/** Why a host does not qualify, in a few words after its name; null when it does. */
async function probeHost(config: pg.ClientConfig, h: DatabaseHost, attrs: SessionAttrs, timeoutMs: number): Promise<string | null> {
  const client = new pg.Client({
    application_name: 'fencepost-probe',
    ...config,
    host: h.host,
    port: h.port,
    connectionTimeoutMillis: timeoutMs,
    query_timeout: timeoutMs,
  });
  client.on('error', () => {});
  try {
    await client.connect();
  } catch (err) {
    const state = sqlState(err);
    if (state !== undefined) return `refused: ${firstLine(err)} (SQLSTATE ${state})`; // a login refused, a server starting or stopping
    const code = (err as { code?: unknown }).code;
    if (code === 'ECONNREFUSED') return 'refused the connection';
    if (/timeout/i.test(firstLine(err))) return `did not answer within ${timeoutMs} ms`;
    return `cannot be reached: ${firstLine(err)}${typeof code === 'string' ? ` (${code})` : ''}`;
  }
  try {
    if (attrs === 'any') return null;
    const m = (await client.query<{ recovery: boolean; read_only: string }>(writability())).rows[0];
    if (m?.recovery) return 'is in recovery (a standby)';
    if (attrs === 'read-write' && m?.read_only === 'on') return 'is read-only (default_transaction_read_only)';
    return null;
  } catch (err) {
    return `failed the check: ${firstLine(err)}`;
  } finally {
    void client.end().catch(() => {});
  }
}

export interface PrimaryFinderOptions {
  hosts: readonly DatabaseHost[];
  attrs: SessionAttrs;
  /** How a probe logs in (user, password, database, TLS, the URL's options); host and port aside. */
  probe: pg.ClientConfig;
  /** Bound on each probe's connect and query (the URL's connect_timeout, else a default). */
  probeTimeoutMs: number;
}

/**
 * Finds and keeps the target host of a host list. Events, on changes only: `found` (host) when a
 * search picks a host after none or another, `lost` (NoWritableHostError) when a search finds none
 * after one did (or at the first search).
 */
export class PrimaryFinder extends EventEmitter<{ found: [DatabaseHost]; lost: [NoWritableHostError] }> {
  /** node-postgres's Client for the proxy's own connections, to the target (hand it to pg.Pool as `Client`). */
  readonly Client: typeof pg.Client;
  /** The same for connections that run client SQL: no ErrorResponse on them suspects the host. */
  readonly ClientSql: typeof pg.Client;
  /** Searches started, for tests and logs. */
  searches = 0;
  private found: DatabaseHost | null = null;
  /** What the events last said: a host, none, or nothing yet. */
  private said: DatabaseHost | 'none' | null = null;
  private search: Promise<DatabaseHost> | null = null;
  private failure: { at: number; err: NoWritableHostError } | null = null;

  constructor(readonly opts: PrimaryFinderOptions) {
    super();
    this.Client = followingClient(this, false);
    this.ClientSql = followingClient(this, true);
  }

  /** The host new connections go to now; null while none is known. */
  current(): DatabaseHost | null {
    return this.found;
  }

  /** The host to connect to: the one found, else the outcome of a search (one at a time). */
  target(): Promise<DatabaseHost> {
    if (this.found) return Promise.resolve(this.found);
    if (this.search) return this.search;
    if (this.failure && Date.now() - this.failure.at < SEARCH_FAILURE_REUSE_MS) return Promise.reject(this.failure.err);
    return this.startSearch();
  }

  /** A connection to `host` failed, or it refused a write: search again, starting now. */
  suspect(host: DatabaseHost): void {
    if (!sameHost(this.found, host)) return;
    this.found = null;
    this.failure = null;
    this.target().catch(() => {});
  }

  private startSearch(): Promise<DatabaseHost> {
    this.searches++;
    const { hosts, attrs, probe, probeTimeoutMs } = this.opts;
    const search = (async () => {
      const probes = hosts.map((h) => probeHost(probe, h, attrs, probeTimeoutMs));
      const reasons: string[] = [];
      for (const [i, p] of probes.entries()) {
        const why = await p;
        if (why === null) return hosts[i]!;
        reasons.push(`${describeHost(hosts[i]!)} ${why}`);
      }
      throw new NoWritableHostError(
        `no host ${attrs === 'any' ? 'accepts connections' : `takes writes (target_session_attrs=${attrs})`}: ${reasons.join('; ')}`,
      );
    })();
    this.search = search;
    search.then(
      (h) => {
        this.search = null;
        this.found = h;
        this.failure = null;
        if (this.said === null || this.said === 'none' || !sameHost(h, this.said)) this.emit('found', h);
        this.said = h;
      },
      (err: NoWritableHostError) => {
        this.search = null;
        this.failure = { at: Date.now(), err };
        if (this.said !== 'none') this.emit('lost', err);
        this.said = 'none';
      },
    );
    return search;
  }
}

/** The Client for connections that run client SQL, of the finder `Client` follows (else `Client` itself). */
export function clientSqlVariant<C>(Client: C): C {
  const finder = (Client as { finder?: unknown }).finder;
  return finder instanceof PrimaryFinder ? (finder.ClientSql as C) : Client;
}

/** Server errors after which the host may no longer be the target. */
function suspicious(code: string | undefined): boolean {
  if (code === undefined) return false;
  if (code === READ_ONLY_SQL_TRANSACTION || code === ADMIN_SHUTDOWN || code === CRASH_SHUTDOWN || code === CANNOT_CONNECT_NOW) return true;
  return code.startsWith('08') && code !== PROTOCOL_VIOLATION;
}

interface ClientInternals {
  host: string;
  port: number;
  connectionParameters: { host: string; port: number };
  connection: EventEmitter & { stream: { destroyed: boolean } };
}

/** A client of a finder's pools, and whether it must not go back to its pool. */
interface FollowingClient extends pg.Client {
  readonly finder: PrimaryFinder;
  /** Where it connected; null before. */
  readonly at: DatabaseHost | null;
  /** It saw 25006: its host takes no writes. */
  readonly stale: boolean;
}

/**
 * A pg.Client that connects to the finder's target, tells the finder when that host fails or
 * refuses a write, and refuses a host that reports itself in hot standby at login (Postgres 14+
 * sends in_hot_standby: no extra round trip).
 */
function followingClient(finder: PrimaryFinder, clientSql: boolean): typeof pg.Client {
  class Following extends pg.Client implements FollowingClient {
    static readonly finder = finder;
    readonly finder = finder;
    at: DatabaseHost | null = null;
    stale = false;
    private closing = false;
    private hotStandby = false;

    constructor(config?: string | pg.ClientConfig) {
      super(config);
      const con = (this as unknown as ClientInternals).connection;
      con.on('parameterStatus', (m: { parameterName: string; parameterValue: string }) => {
        if (m.parameterName === 'in_hot_standby') this.hotStandby = m.parameterValue === 'on';
      });
      con.on('errorMessage', (m: { code?: string }) => {
        if (m.code === READ_ONLY_SQL_TRANSACTION) this.stale = true;
        // Client SQL raises what it likes; a server that really ends the session also ends the connection ('end').
        if (this.at && !clientSql && suspicious(m.code)) finder.suspect(this.at);
      });
      con.on('error', () => {
        if (this.at && !this.closing) finder.suspect(this.at);
      });
      con.once('end', () => {
        if (this.at && !this.closing) finder.suspect(this.at);
      });
    }

    override connect(): Promise<pg.Client>;
    override connect(callback: (err: Error) => void): void;
    override connect(callback?: (err: Error) => void): Promise<pg.Client> | void {
      const self = this as unknown as ClientInternals;
      const connected = finder.target().then(async (h) => {
        // pg-pool's connect timeout destroys the socket: do not revive it.
        if (self.connection.stream.destroyed) throw new Error('Connection terminated due to connection timeout');
        this.at = h;
        self.host = self.connectionParameters.host = h.host;
        self.port = self.connectionParameters.port = h.port;
        try {
          await super.connect();
        } catch (err) {
          if (sqlState(err) === undefined || suspicious(sqlState(err))) finder.suspect(h);
          throw err;
        }
        if (this.hotStandby && finder.opts.attrs !== 'any') {
          finder.suspect(h);
          this.closing = true;
          await super.end().catch(() => {});
          throw new NoWritableHostError(
            `${describeHost(h)} is in hot standby (target_session_attrs=${finder.opts.attrs}); looking for the primary again`,
          );
        }
        return this as pg.Client;
      });
      if (!callback) return connected;
      connected.then(
        () => (callback as (err: Error | null) => void)(null),
        (err: Error) => callback(err),
      );
    }

    override end(): Promise<void>;
    override end(callback: (err: Error) => void): void;
    override end(callback?: (err: Error) => void): Promise<void> | void {
      this.closing = true;
      return callback ? super.end(callback) : super.end();
    }
  }
  return Following;
}

function isFollowing(client: unknown): client is FollowingClient {
  return client instanceof pg.Client && (client as Partial<FollowingClient>).finder instanceof PrimaryFinder;
}

/**
 * Makes a pool of a finder's clients close, instead of keeping, a client released after its host
 * refused a write (25006) or while its host is no longer the target. A no-op for other pools.
 */
export function leaveOldHosts(pool: pg.Pool): pg.Pool {
  pool.on('release', (_err: Error | undefined, client: pg.PoolClient) => {
    if (!isFollowing(client)) return;
    if (client.stale || !sameHost(client.at, client.finder.current())) client.end().catch(() => {});
  });
  return pool;
}

/** A client for `config` (clientConfig's): a finder's, when it names one. */
export function newClient(config: pg.ClientConfig & { Client?: typeof pg.Client }): pg.Client {
  return new (config.Client ?? pg.Client)(config);
}

const finders = new Map<string, PrimaryFinder>();

/** The process's finder for a host list (by a key naming the list and how to log in): one per database. */
export function finderFor(key: string, opts: () => PrimaryFinderOptions): PrimaryFinder {
  let f = finders.get(key);
  if (!f) {
    f = new PrimaryFinder(opts());
    finders.set(key, f);
  }
  return f;
}
