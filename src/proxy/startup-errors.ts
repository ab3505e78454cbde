// Why the proxy could not start, in one line naming the setting to look at: the HTTP port taken,
// a database refusing the password or not there, ZooKeeper out of reach. The CLI prints the
// message alone (no stack: the cause is the message); the original error stays as `cause`.
import { createServer } from 'node:net';
import { lookup } from 'node:dns/promises';
import pg from 'pg';
import { ZkSession } from '../election/index.ts';
import { NoWritableHostError } from '../fence/index.ts';
import { databaseTarget, describeTarget } from '../fence/admin.ts';
import type { ForgeryGuardConfig } from './forgery-guard.ts';
import { PortRangeFullError, listenInRange, type PortRange } from '../ports.ts';

export class StartupError extends Error {
  constructor(
    /** The setting to look at (an environment variable's name). */
    readonly setting: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(`${setting}: ${message}`, options);
    this.name = 'StartupError';
  }
}

/** Node's system errors carry `code`; a connect to several addresses fails with an AggregateError of them. */
function systemCode(err: unknown): string | undefined {
  if (err instanceof AggregateError) return systemCode(err.errors[0]);
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

function firstLine(err: unknown): string {
  const message = err instanceof Error ? err.message || (err instanceof AggregateError ? String(err.errors[0]) : err.name) : String(err);
  return message.split('\n')[0]!;
}

function hostPort(host: string, port: number): string {
  return `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

/** The settings that choose a listening port: the HTTP door's and the SQL endpoint's. */
export type PortSetting = 'PORT' | 'FENCEPOST_PGWIRE_PORT';

/** What to change when the port is taken, per setting. */
const PORT_HINTS: Readonly<Record<PortSetting, string>> = {
  PORT: 'set PORT or --port',
  FENCEPOST_PGWIRE_PORT: 'set FENCEPOST_PGWIRE_PORT',
};

/**
 * A bind test of a listening address, before Postgres starts: the port in use (or a HOST that is
 * not this machine's) fails in a moment, not after a cluster start. `setting` names the port's.
 * Port 0 with a `range` (FENCEPOST_PORT_RANGE) tries a port of the range: a full range fails here too.
 */
export async function checkListenAddress(
  host: string,
  port: number,
  setting: PortSetting = 'PORT',
  range: PortRange | null = null,
): Promise<void> {
  await listenInRange(
    port,
    range,
    (p) =>
      new Promise<void>((resolve, reject) => {
        const server = createServer();
        server.once('error', reject);
        server.listen({ host, port: p, exclusive: true }, () => server.close(() => resolve()));
      }),
  ).catch((err: unknown) => {
    throw listenError(err, host, port, setting, range);
  });
}

/**
 * A failed listen on the HTTP door's address (PORT) or the SQL endpoint's (FENCEPOST_PGWIRE_PORT),
 * described; `port` as configured (0: a free one, of `range` when set).
 */
export function listenError(
  err: unknown,
  host: string,
  port: number,
  setting: PortSetting = 'PORT',
  range: PortRange | null = null,
): StartupError {
  if (err instanceof PortRangeFullError) return portRangeFull(err, setting);
  const at = hostPort(host, port);
  switch (systemCode(err)) {
    case 'EADDRINUSE':
      if (port === 0 && range !== null)
        return new StartupError(
          setting,
          `${host}: each port picked from FENCEPOST_PORT_RANGE ${range[0]}-${range[1]} was taken before it could be bound (another process is using the range's ports)`,
          { cause: err },
        );
      return new StartupError(setting, `${at} is already in use (another fencepost serve? ${PORT_HINTS[setting]})`, { cause: err });
    case 'EACCES':
      return new StartupError(setting, `not allowed to listen on ${at} (ports below 1024 need privileges)`, { cause: err });
    case 'EADDRNOTAVAIL':
      return new StartupError('HOST', `${host} is not an address of this machine`, { cause: err });
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return new StartupError('HOST', `cannot resolve ${host}`, { cause: err });
    default:
      return new StartupError(setting, `cannot listen on ${at}: ${firstLine(err)}`, { cause: err });
  }
}

/** FENCEPOST_PORT_RANGE has no free port left for the port of `setting` (asked for 0). */
export function portRangeFull(err: PortRangeFullError, setting: string): StartupError {
  const [lo, hi] = err.range;
  return new StartupError('FENCEPOST_PORT_RANGE', `no free port in ${lo}-${hi} for ${setting}: every port of it is in use`, { cause: err });
}

/**
 * The first use of the database failed: say where and why, without the URL's password.
 * `setting` is DATABASE_URL, or FENCEPOST_DATA_DIR for the embedded Postgres.
 */
export function databaseError(err: unknown, setting: string, databaseUrl: string): StartupError {
  // Several hosts, none fit: the message names each and why.
  if (err instanceof NoWritableHostError) return new StartupError(setting, err.message, { cause: err });
  let where = 'the database';
  let database = '';
  try {
    const t = databaseTarget(databaseUrl);
    where = describeTarget(t);
    database = t.database;
  } catch {
    // a malformed URL was refused by loadConfig; keep the generic name
  }
  if (err instanceof pg.DatabaseError) {
    // PgBouncer refuses the `options` the proxy's connections carry (synchronous_commit=on, timeouts).
    const pooler = /unsupported startup parameter/i.test(err.message)
      ? ". DATABASE_URL must reach Postgres itself, not a connection pooler: the proxy pools its own connections and sets each one's synchronous_commit and timeouts"
      : '';
    return new StartupError(
      setting,
      `${where}${database ? ` (database ${database})` : ''}: ${firstLine(err)} (SQLSTATE ${err.code ?? '?'})${pooler}`,
      { cause: err },
    );
  }
  switch (systemCode(err)) {
    case 'ECONNREFUSED':
      return new StartupError(setting, `nothing is listening at ${where} (connection refused)`, { cause: err });
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return new StartupError(setting, `cannot resolve the host of ${where}`, { cause: err });
    case 'ETIMEDOUT':
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return new StartupError(setting, `cannot reach ${where} (${systemCode(err)})`, { cause: err });
  }
  if (/timeout/i.test(firstLine(err))) return new StartupError(setting, `no answer from ${where} (${firstLine(err)})`, { cause: err });
  return new StartupError(setting, `${where}: ${firstLine(err)}`, { cause: err });
}

/** Hosts of a ZooKeeper connect string (`h1:2181,h2:2181/chroot`). */
function zkHosts(connect: string): string[] {
  const servers = connect.split('/')[0]!.split(',');
  return servers.map((s) => s.trim().replace(/:\d+$/, '')).filter((h) => h !== '');
}

/**
 * The forgery guard's ZooKeeper, checked at start: its names resolve and a session opens (with the
 * elections' credentials). Afterwards an outage only answers 503 to the writes that need a check.
 */
export async function checkZooKeeper(guard: ForgeryGuardConfig, connectTimeoutMs = 5000): Promise<void> {
  const hosts = zkHosts(guard.zkConnect);
  const resolved = await Promise.all(
    hosts.map((h) =>
      lookup(h).then(
        () => null,
        (err: unknown) => ({ host: h, err }),
      ),
    ),
  );
  const failures = resolved.filter((r) => r !== null);
  if (hosts.length === 0 || failures.length === hosts.length) {
    const first = failures[0];
    throw new StartupError(
      'ZK_CONNECT',
      first
        ? `cannot resolve ${failures.map((f) => f.host).join(', ')} (${systemCode(first.err) ?? firstLine(first.err)})`
        : `no server in ${JSON.stringify(guard.zkConnect)}`,
      {
        cause: first?.err,
      },
    );
  }
  let session: ZkSession;
  try {
    session = await ZkSession.open({
      connect: guard.zkConnect,
      sessionTimeoutMs: 10_000,
      connectTimeoutMs,
      ...(guard.electionAuth ? { auth: guard.electionAuth } : {}),
    });
  } catch (err) {
    throw new StartupError('ZK_CONNECT', `ZooKeeper at ${guard.zkConnect} unreachable: ${firstLine(err)}`, { cause: err });
  }
  await session.close();
}
