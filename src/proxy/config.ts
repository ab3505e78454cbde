// Proxy configuration: read once from the environment, validated, frozen. A bad value fails fast
// with a message naming the variable.
import { readFileSync } from 'node:fs';
import { homedir, tmpdir, userInfo } from 'node:os';
import { isAbsolute, join, resolve } from 'node:path';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { isIP } from 'node:net';
import { parseKeys, type AccessKey } from './access/keys.ts';
import type { ForgeryGuardConfig } from './forgery-guard.ts';
import { parseDigestAuth, type DigestAuth, electionPathProblem } from '../election/index.ts';
import { checkDatabaseUrl } from '../fence/admin.ts';
import { parseHostName, parseOrigin } from './http/browser-guard.ts';
import { ConfigError } from '../config-error.ts';
import { portRange, type PortRange } from '../ports.ts';

export { ConfigError };

/** The proxy's certificate and key files (src/proxy/access/tls.ts loads them). */
export interface TlsFiles {
  /** PEM certificate chain (leaf first): FENCEPOST_TLS_CERT. */
  certFile: string;
  /** PEM private key of the leaf: FENCEPOST_TLS_KEY. */
  keyFile: string;
}

export interface ProxyConfig {
  /** Postgres to use; null = start an embedded one. */
  databaseUrl: string | null;
  host: string;
  port: number;
  /** Embedded Postgres data folder (only without DATABASE_URL). */
  dataDir: string;
  /** Where `serve` records the embedded clusters it runs, so a command given another folder can name the running one. */
  clusterRegistry: string;
  /** Embedded Postgres port (only without DATABASE_URL): FENCEPOST_EMBEDDED_PG_PORT; 0 = a free port, picked at each start. */
  embeddedPgPort: number;
  /** FENCEPOST_PORT_RANGE: where port 0 (PORT, FENCEPOST_PGWIRE_PORT, FENCEPOST_EMBEDDED_PG_PORT) binds; null = the OS picks. */
  portRange: PortRange | null;
  /** FENCEPOST_TLS_CERT / FENCEPOST_TLS_KEY: serve HTTPS only (and TLS on the SQL endpoint); null = plain. */
  tls: Readonly<TlsFiles> | null;
  /** The SQL endpoint's port (PostgreSQL protocol, FENCEPOST_PGWIRE_PORT); null = off. */
  pgwirePort: number | null;
  /** SQL endpoint sessions at once; each holds a backend connection. */
  pgwireMaxConnections: number;
  bodyLimitBytes: number;
  poolSize: number;
  /** Bound on each statement of the fenced write path and reads (0 = none). */
  statementTimeoutMs: number;
  /** Postgres lock_timeout of the main pool: a write waiting this long on a locked fence row fails (503). */
  lockTimeoutMs: number;
  /** FENCEPOST_PGWIRE_SPARE_BACKENDS: backends logged in ahead of connects (sql/spares.ts); 0: none. */
  pgwireSpareBackends: number;
  /** FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS: connections in startup from one address at once. */
  pgwireMaxStartupsPerAddress: number;
  /** FENCEPOST_PGWIRE_MAX_SESSIONS_PER_KEY: SQL endpoint sessions one key may hold. */
  pgwireMaxSessionsPerKey: number;
  /** FENCEPOST_TX_MAX_PER_KEY: of FENCEPOST_TX_POOL_SIZE, the transactions one key may run at once. */
  txMaxPerKey: number;
  /** FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS: the SQL endpoint ends a transaction left idle this long (0: never). */
  pgwireIdleInTransactionMs: number;
  /** FENCEPOST_RAISE_WAIT_MS: a raise waits this long for older tokens' transactions, then ends them. */
  raiseWaitMs: number;
  /** Fenced write batches (statements) in flight at once. */
  writeConcurrency: number;
  /** Most writes coalesced into one statement; 1 = no coalescing. */
  maxBatch: number;
  logLevel: string;
  /** Grace for in-flight requests at shutdown. */
  shutdownTimeoutMs: number;
  /** Rejection log retention: delete rows older than this; 0 = no age limit. */
  rejectionsMaxAgeMs: number;
  /** Rejection log retention: keep at most this many rows (the newest); 0 = no row limit. */
  rejectionsMaxRows: number;
  /** Time between rejection log prune rounds. */
  rejectionsPruneIntervalMs: number;
  /** Bearer keys (FENCEPOST_KEYS_FILE or FENCEPOST_KEYS); empty = the proxy runs open. */
  keys: readonly AccessKey[];
  /** Reads: open, or any configured key (default when keys are configured). */
  readAccess: 'open' | 'key';
  /** FENCEPOST_ALLOW_OPEN=1: no keys, yet bind a non-loopback HOST. */
  allowOpen: boolean;
  /** Whole request (headers and body) must arrive within this; else 408 and the connection closes. */
  requestTimeoutMs: number;
  /** Origins whose pages may call the proxy (FENCEPOST_ALLOWED_ORIGINS); default none. */
  allowedOrigins: readonly string[];
  /** Host names an open-mode proxy answers to besides IP addresses and localhost (FENCEPOST_ALLOWED_HOSTS). */
  allowedHosts: readonly string[];
  /** Token forgery guard; null = off. */
  forgeryGuard: ForgeryGuardConfig | null;
  /** POST /v1/transactions: connections of its own pool, statements, timeout, retries. */
  txPoolSize: number;
  txMaxStatements: number;
  txStatementTimeoutMs: number;
  txRetries: number;
  /** Deadline of a whole transaction (queue wait included); past it the backend is terminated. */
  txTimeoutMs: number;
  /** Most result bytes per transaction, counted as they stream in. */
  txMaxResultBytes: number;
  /** Login of client SQL in open mode, and prefix of the per-key logins. */
  clientRole: string;
  /** How often the HTTP door reads the protected object-key prefixes again (it also does after Postgres refused a write as misfenced). */
  protectedPrefixRefreshMs: number;
  /**
   * FENCEPOST_DURABILITY_CHECK_MS: time between checks of whether a Postgres failover keeps every
   * fence raise (src/fence/durability-monitor.ts).
   */
  durabilityCheckMs: number;
  /** FENCEPOST_REQUIRE_SYNC_STANDBY=1: refuse writes (503 durability_unsafe) while a failover could lose a fence raise. */
  requireSyncStandby: boolean;
}

/** Defaults of the fenced write path (FenceStore); writeConcurrency is capped below the pool size. */
export const STORE_DEFAULTS = Object.freeze({
  concurrency: 2,
  maxBatch: 64,
  maxBatchBytes: 4 * 1024 * 1024,
  // After a deadlock or serialization failure: of a write statement, and of recording a rejection (every door's).
  retries: 5,
  // Failures to record a rejection: the first of a kind logged, repeats counted per window (src/logging/repeat-limiter.ts).
  logRepeatWindowMs: 5_000,
});

/** How the log is kept small under floods (src/logging): stale rejections summed per interval, repeated errors counted per window. */
export const LOG_DEFAULTS = Object.freeze({
  staleIntervalMs: 10_000,
  staleMaxFenceKeys: 20,
  repeatWindowMs: 5_000,
  repeatMaxKinds: 100,
});

/** Defaults of POST /v1/transactions (also buildApp's, for tests and embedding). */
export const TX_DEFAULTS = Object.freeze({
  clientRole: 'fencepost_client',
  // Transactions in flight at once, over all keys (each on a connection of its key's login).
  maxConcurrent: 16,
  maxStatements: 100,
  statementTimeoutMs: 5000,
  // FENCEPOST_LOCK_TIMEOUT_MS, for the write path and transactions alike (see loadConfig).
  lockTimeoutMs: 1000,
  transactionTimeoutMs: 30_000,
  // FENCEPOST_RAISE_WAIT_MS: how long a raise waits for the older token's transactions on its fence
  // before it ends them (src/fence/raise.ts). Well under an election session timeout: a new leader
  // is writing within that plus this, whatever the old one left open.
  raiseWaitMs: 1000,
  // A key whose login could not be provisioned is checked again after this (the operator may have run the SQL).
  provisionRetryMs: 5000,
  maxResultBytes: 4 * 1024 * 1024,
  retries: 3,
});

/** Defaults of protected data (`fencepost protect`): how the HTTP door keeps its copy of the protected prefixes (also buildApp's). */
export const PROTECT_DEFAULTS = Object.freeze({
  // Postgres refuses a misfenced object whatever the copy says; a stale copy costs the first such
  // write one refused statement and a re-read, so the interval only bounds how long a prefix
  // declared elsewhere waits to be resolved without that detour.
  prefixRefreshMs: 5000,
});

/** Defaults of the durability monitor (src/fence/durability-monitor.ts). */
export const DURABILITY_DEFAULTS = Object.freeze({
  // Each check opens one short connection and runs three reads: cheap at this pace, and a standby
  // that stops streaming is seen (and, with FENCEPOST_REQUIRE_SYNC_STANDBY, writes refused) within it.
  checkMs: 10_000,
});

/** Defaults of the SQL endpoint (FENCEPOST_PGWIRE_PORT). */
export const PGWIRE_DEFAULTS = Object.freeze({
  // Each session holds a backend connection of its own: stay well below Postgres's max_connections.
  maxConnections: 100,
  startupTimeoutMs: 10_000,
  // The idle_in_transaction_session_timeout sessions start with (FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS):
  // none, as in Postgres. A paused leader's open transaction does not need it: a new leader's raise
  // waits FENCEPOST_RAISE_WAIT_MS for it, then ends its backend (definitions.ts revoke_older_sessions).
  // An operator may still bound idle transactions here, or in Postgres (ALTER ROLE … SET).
  idleInTransactionMs: 0,
  // Connections from one address that have sent nothing yet: past this, a new one closes the
  // oldest silent for a second, so idle TCP connections cannot keep writers out.
  maxStartupsPerAddress: 16,
  // Backends logged in and warmed ahead of the next connect like the last one (sql/spares.ts),
  // within FENCEPOST_PGWIRE_MAX_CONNECTIONS; each is kept this long untaken.
  spareBackends: 4,
  spareKeepMs: 10_000,
});

/** A key's share of `total` when several keys share it: half (at least 1); all of it for one key or open mode. */
function fairShare(keys: readonly AccessKey[], total: number): number {
  return keys.length > 1 ? Math.max(1, Math.ceil(total / 2)) : total;
}

/**
 * The embedded Postgres's default data folder: one per OS user and checkout (this package's
 * folder), so proxies started from two checkouts each get their own cluster, and two started from
 * the same checkout meet on one folder (the second is refused: Postgres already running). In a
 * place that survives a reboot (fence rows are never deleted: a lost fence table would let an old
 * token write again): $XDG_DATA_HOME/fencepost, else ~/.local/share/fencepost; as root
 * /var/lib/fencepost, since Postgres then runs as the postgres user, who cannot reach /root.
 */
export function defaultDataDir(
  packageRoot: string = PACKAGE_ROOT,
  uid: number = userInfo().uid,
  env: NodeJS.ProcessEnv = process.env,
): string {
  return join(dataHome(uid, env), checkoutId(packageRoot), 'pgdata');
}

/**
 * The folder (in the same data home as the default data folder) where each `fencepost serve` of
 * this user records the data folder of the embedded cluster it runs, whatever FENCEPOST_DATA_DIR
 * says: `db-url`, `migrate`, `protect` and `doctor`, finding no cluster on their folder, name those.
 */
export function clusterRegistryDir(uid: number = userInfo().uid, env: NodeJS.ProcessEnv = process.env): string {
  return join(dataHome(uid, env), 'running');
}

function dataHome(uid: number, env: NodeJS.ProcessEnv): string {
  if (uid === 0) return '/var/lib/fencepost';
  const xdg = env.XDG_DATA_HOME;
  if (xdg !== undefined && isAbsolute(xdg)) return join(xdg, 'fencepost');
  return join(env.HOME || homedir(), '.local', 'share', 'fencepost');
}

function checkoutId(packageRoot: string): string {
  return createHash('sha256').update(resolve(packageRoot)).digest('hex').slice(0, 12);
}

/** Where fencepost 0.1 kept the default data folder: under the temp folder, which many systems clear at boot. */
export function legacyDataDir(packageRoot: string = PACKAGE_ROOT, uid: number = userInfo().uid): string {
  return join(tmpdir(), `fencepost-${uid}-${checkoutId(packageRoot)}`, 'pgdata');
}

/** This package's folder (src/proxy/ and dist/proxy/ are both two levels down). */
const PACKAGE_ROOT = fileURLToPath(new URL('../..', import.meta.url));

export const DEFAULT_DATA_DIR = defaultDataDir();

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

function int(env: NodeJS.ProcessEnv, name: string, def: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^-?\d+$/.test(raw)) throw new ConfigError(name, `must be a whole number, got ${JSON.stringify(raw)}`);
  const n = Number(raw);
  if (n < min || n > max) throw new ConfigError(name, `must be between ${min} and ${max}, got ${n}`);
  return n;
}

/** The client login's name: a plain identifier short enough to take a key name after it. */
function clientRole(env: NodeJS.ProcessEnv): string {
  const raw = env.FENCEPOST_CLIENT_ROLE;
  if (raw === undefined || raw === '') return TX_DEFAULTS.clientRole;
  if (!/^[a-z_][a-z0-9_]{0,39}$/.test(raw))
    throw new ConfigError('FENCEPOST_CLIENT_ROLE', 'must be 1–40 of a-z 0-9 _ (not starting with a digit)');
  return raw;
}

/** Loopback addresses: binding one of these without keys is safe. */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '');
  if (h === 'localhost') return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) return h === '::1' || /^::ffff:127\./i.test(h);
  return false;
}

/** With no keys the proxy is open to anyone who can reach it: only loopback, unless allowed. */
export function assertSafeBind(config: Pick<ProxyConfig, 'host' | 'keys' | 'allowOpen'>): void {
  if (config.keys.length === 0 && !config.allowOpen && !isLoopbackHost(config.host)) {
    throw new ConfigError(
      'HOST',
      `${config.host} is not a loopback address and no keys are configured (FENCEPOST_KEYS_FILE / FENCEPOST_KEYS): anyone could write; configure keys or set FENCEPOST_ALLOW_OPEN=1`,
    );
  }
}

function loadKeys(env: NodeJS.ProcessEnv): AccessKey[] {
  const file = env.FENCEPOST_KEYS_FILE;
  const inline = env.FENCEPOST_KEYS;
  if (file && inline) throw new ConfigError('FENCEPOST_KEYS', 'set FENCEPOST_KEYS or FENCEPOST_KEYS_FILE, not both');
  const variable = file ? 'FENCEPOST_KEYS_FILE' : 'FENCEPOST_KEYS';
  let json: string;
  if (file) {
    try {
      json = readFileSync(file, 'utf8');
    } catch (err) {
      throw new ConfigError(variable, `cannot read ${file}: ${(err as Error).message}`);
    }
  } else if (inline) json = inline;
  else return [];
  try {
    return parseKeys(json);
  } catch (err) {
    throw new ConfigError(variable, (err as Error).message);
  }
}

/** A comma-separated list (blanks around entries ignored), each entry checked by `parse`; frozen. */
function list(env: NodeJS.ProcessEnv, name: string, parse: (raw: string) => string): readonly string[] {
  const raw = env[name];
  if (raw === undefined || raw.trim() === '') return Object.freeze([]);
  const entries = raw.split(',').map((e) => e.trim());
  if (entries.some((e) => e === '')) throw new ConfigError(name, 'has an empty entry (stray comma)');
  try {
    return Object.freeze([...new Set(entries.map(parse))]);
  } catch (err) {
    throw new ConfigError(name, (err as Error).message);
  }
}

function loadForgeryGuard(env: NodeJS.ProcessEnv): ForgeryGuardConfig | null {
  const raw = env.FENCEPOST_FORGERY_GUARD;
  if (!raw) return null;
  let doc: unknown;
  try {
    doc = JSON.parse(raw);
  } catch {
    throw new ConfigError('FENCEPOST_FORGERY_GUARD', 'must be JSON: {"<fence-key prefix>": "<election path>", …}');
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc) || Object.keys(doc).length === 0) {
    throw new ConfigError('FENCEPOST_FORGERY_GUARD', 'must be a non-empty JSON object {"<fence-key prefix>": "<election path>", …}');
  }
  const mappings = Object.entries(doc).map(([prefix, electionPath]) => {
    if (typeof electionPath !== 'string' || electionPathProblem(electionPath) !== null) {
      throw new ConfigError(
        'FENCEPOST_FORGERY_GUARD',
        `election path for ${JSON.stringify(prefix)} must be an absolute ZooKeeper path without a trailing slash`,
      );
    }
    return Object.freeze({ prefix, electionPath });
  });
  const zkConnect = env.ZK_CONNECT;
  if (!zkConnect) throw new ConfigError('ZK_CONNECT', 'is required when FENCEPOST_FORGERY_GUARD is set');
  // The elections' credentials: the guard trusts only election paths reserved to their identity
  // (and reads with them, to see ACLs in full; it writes nothing).
  const zkAuth = env.ZK_AUTH;
  if (!zkAuth)
    throw new ConfigError(
      'ZK_AUTH',
      'is required when FENCEPOST_FORGERY_GUARD is set: the user:password the elections run with (fencepost elect --zk-auth); the guard trusts only election nodes made under it',
    );
  let electionAuth: DigestAuth;
  try {
    electionAuth = Object.freeze(parseDigestAuth(zkAuth));
  } catch (err) {
    throw new ConfigError('ZK_AUTH', (err as Error).message);
  }
  return Object.freeze({ zkConnect, mappings: Object.freeze(mappings), electionAuth });
}

/**
 * The SQL endpoint's port: off unless set. (The embedded Postgres's port was FENCEPOST_PG_PORT,
 * a name too easily taken for this one: it is refused, naming its new name.)
 */
function pgwirePort(env: NodeJS.ProcessEnv): number | null {
  const raw = env.FENCEPOST_PGWIRE_PORT;
  if (raw === undefined || raw === '') return null;
  return int(env, 'FENCEPOST_PGWIRE_PORT', 0, 0, 65535);
}

/** Both files or neither; their contents are read and checked at start (TlsMaterial.load). */
function tlsFiles(env: NodeJS.ProcessEnv): Readonly<TlsFiles> | null {
  const certFile = env.FENCEPOST_TLS_CERT || null;
  const keyFile = env.FENCEPOST_TLS_KEY || null;
  if (certFile === null && keyFile === null) return null;
  if (certFile === null)
    throw new ConfigError('FENCEPOST_TLS_CERT', 'is required with FENCEPOST_TLS_KEY (set both, or neither for plain HTTP)');
  if (keyFile === null)
    throw new ConfigError('FENCEPOST_TLS_KEY', 'is required with FENCEPOST_TLS_CERT (set both, or neither for plain HTTP)');
  return Object.freeze({ certFile, keyFile });
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Readonly<ProxyConfig> {
  const databaseUrl = env.DATABASE_URL ? env.DATABASE_URL : null;
  if (databaseUrl !== null && !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    throw new ConfigError('DATABASE_URL', 'must be a postgres:// or postgresql:// URL');
  }
  if (databaseUrl !== null) {
    try {
      checkDatabaseUrl(databaseUrl);
    } catch (err) {
      throw new ConfigError('DATABASE_URL', `cannot be used: ${(err as Error).message}`);
    }
  }
  const logLevel = env.FENCEPOST_LOG_LEVEL ?? 'info';
  if (!LOG_LEVELS.includes(logLevel)) throw new ConfigError('FENCEPOST_LOG_LEVEL', `must be one of ${LOG_LEVELS.join(', ')}`);
  const host = env.HOST ?? '127.0.0.1';
  if (host.trim() === '') throw new ConfigError('HOST', 'must not be empty');
  const poolSize = int(env, 'FENCEPOST_POOL_SIZE', 10, 2, 1000);
  const writeConcurrency = int(env, 'FENCEPOST_WRITE_CONCURRENCY', Math.min(STORE_DEFAULTS.concurrency, poolSize - 1), 1, 1000);
  if (writeConcurrency >= poolSize)
    throw new ConfigError(
      'FENCEPOST_WRITE_CONCURRENCY',
      `must be below FENCEPOST_POOL_SIZE (${poolSize}) so reads always find a connection`,
    );
  const statementTimeoutMs = int(env, 'FENCEPOST_STATEMENT_TIMEOUT_MS', 10_000, 0, 3_600_000);
  // A healthy writer holds a fence row only for its own statement or its transaction's commit
  // (milliseconds even under load: p99 16 ms in the README's benchmark). A wait of a second means
  // something holds the row far longer (a slow or hostile transaction): fail that fence's writes
  // with 503 (nothing committed, safe to retry) instead of letting them fill the write slots that
  // every other fence's writes need. 1 s leaves two orders of magnitude over a commit, and stays
  // well below the statement timeout.
  const lockTimeoutMs = int(env, 'FENCEPOST_LOCK_TIMEOUT_MS', TX_DEFAULTS.lockTimeoutMs, 1, 3_600_000);
  if (statementTimeoutMs > 0 && lockTimeoutMs >= statementTimeoutMs) {
    throw new ConfigError(
      'FENCEPOST_LOCK_TIMEOUT_MS',
      `must be below FENCEPOST_STATEMENT_TIMEOUT_MS (${statementTimeoutMs}), or a locked fence would still hold its writes until the statement timeout`,
    );
  }
  const rejectionsMaxAgeMs = int(env, 'FENCEPOST_REJECTIONS_MAX_AGE_MS', 7 * 24 * 3600 * 1000, 0, 3650 * 24 * 3600 * 1000);
  const rejectionsMaxRows = int(env, 'FENCEPOST_REJECTIONS_MAX_ROWS', 1_000_000, 0, 1_000_000_000_000);
  if (rejectionsMaxAgeMs === 0 && rejectionsMaxRows === 0) {
    throw new ConfigError(
      'FENCEPOST_REJECTIONS_MAX_ROWS',
      'and FENCEPOST_REJECTIONS_MAX_AGE_MS cannot both be 0: the rejection log must be bounded',
    );
  }
  const keys = loadKeys(env);
  const readAccess = env.FENCEPOST_READ_ACCESS || (keys.length > 0 ? 'key' : 'open');
  if (readAccess !== 'open' && readAccess !== 'key') throw new ConfigError('FENCEPOST_READ_ACCESS', 'must be open or key');
  if (readAccess === 'key' && keys.length === 0)
    throw new ConfigError('FENCEPOST_READ_ACCESS', 'key needs keys (FENCEPOST_KEYS_FILE / FENCEPOST_KEYS)');
  const allowOpenRaw = env.FENCEPOST_ALLOW_OPEN ?? '';
  if (!['', '0', '1'].includes(allowOpenRaw)) throw new ConfigError('FENCEPOST_ALLOW_OPEN', 'must be 0 or 1');
  const allowOpen = allowOpenRaw === '1';
  const requireSyncRaw = env.FENCEPOST_REQUIRE_SYNC_STANDBY ?? '';
  if (!['', '0', '1'].includes(requireSyncRaw)) throw new ConfigError('FENCEPOST_REQUIRE_SYNC_STANDBY', 'must be 0 or 1');
  assertSafeBind({ host, keys, allowOpen });
  if (env.FENCEPOST_PG_PORT !== undefined && env.FENCEPOST_PG_PORT !== '') {
    throw new ConfigError(
      'FENCEPOST_PG_PORT',
      "was renamed FENCEPOST_EMBEDDED_PG_PORT (the embedded Postgres's port; the SQL endpoint's is FENCEPOST_PGWIRE_PORT)",
    );
  }
  const forgeryGuard = loadForgeryGuard(env);
  const sqlPort = pgwirePort(env);
  const pgwireMax = int(env, 'FENCEPOST_PGWIRE_MAX_CONNECTIONS', PGWIRE_DEFAULTS.maxConnections, 1, 10_000);
  const txPoolSize = int(env, 'FENCEPOST_TX_POOL_SIZE', TX_DEFAULTS.maxConcurrent, 1, 1000);
  return Object.freeze({
    databaseUrl,
    host,
    port: int(env, 'PORT', 8080, 0, 65535),
    dataDir: env.FENCEPOST_DATA_DIR || DEFAULT_DATA_DIR,
    clusterRegistry: clusterRegistryDir(userInfo().uid, env),
    embeddedPgPort: int(env, 'FENCEPOST_EMBEDDED_PG_PORT', 0, 0, 65535),
    portRange: portRange(env),
    tls: tlsFiles(env),
    pgwirePort: sqlPort,
    pgwireMaxConnections: pgwireMax,
    pgwireIdleInTransactionMs: int(
      env,
      'FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS',
      PGWIRE_DEFAULTS.idleInTransactionMs,
      0,
      24 * 3600 * 1000,
    ),
    pgwireMaxStartupsPerAddress: int(env, 'FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS', PGWIRE_DEFAULTS.maxStartupsPerAddress, 1, 10_000),
    pgwireSpareBackends: int(env, 'FENCEPOST_PGWIRE_SPARE_BACKENDS', PGWIRE_DEFAULTS.spareBackends, 0, 100),
    // With several keys, no key may hold more than half of what is shared, so another always finds room.
    pgwireMaxSessionsPerKey: int(env, 'FENCEPOST_PGWIRE_MAX_SESSIONS_PER_KEY', fairShare(keys, pgwireMax), 1, 10_000),
    txMaxPerKey: int(env, 'FENCEPOST_TX_MAX_PER_KEY', fairShare(keys, txPoolSize), 1, 1000),
    bodyLimitBytes: int(env, 'FENCEPOST_BODY_LIMIT_BYTES', 1024 * 1024, 1, 512 * 1024 * 1024),
    poolSize,
    writeConcurrency,
    statementTimeoutMs,
    lockTimeoutMs,
    raiseWaitMs: int(env, 'FENCEPOST_RAISE_WAIT_MS', TX_DEFAULTS.raiseWaitMs, 0, 600_000),
    maxBatch: int(env, 'FENCEPOST_MAX_BATCH', STORE_DEFAULTS.maxBatch, 1, 10_000),
    logLevel,
    shutdownTimeoutMs: int(env, 'FENCEPOST_SHUTDOWN_TIMEOUT_MS', 10_000, 0, 600_000),
    rejectionsMaxAgeMs,
    rejectionsMaxRows,
    rejectionsPruneIntervalMs: int(env, 'FENCEPOST_REJECTIONS_PRUNE_INTERVAL_MS', 60_000, 100, 24 * 3600 * 1000),
    keys: Object.freeze(keys),
    readAccess,
    allowOpen,
    requestTimeoutMs: int(env, 'FENCEPOST_REQUEST_TIMEOUT_MS', 30_000, 100, 3_600_000),
    allowedOrigins: list(env, 'FENCEPOST_ALLOWED_ORIGINS', parseOrigin),
    allowedHosts: list(env, 'FENCEPOST_ALLOWED_HOSTS', parseHostName),
    forgeryGuard,
    txPoolSize,
    txMaxStatements: int(env, 'FENCEPOST_TX_MAX_STATEMENTS', TX_DEFAULTS.maxStatements, 1, 10_000),
    txStatementTimeoutMs: int(env, 'FENCEPOST_TX_STATEMENT_TIMEOUT_MS', TX_DEFAULTS.statementTimeoutMs, 1, 3_600_000),
    txRetries: int(env, 'FENCEPOST_TX_RETRIES', TX_DEFAULTS.retries, 0, 100),
    txTimeoutMs: int(env, 'FENCEPOST_TX_TIMEOUT_MS', TX_DEFAULTS.transactionTimeoutMs, 100, 3_600_000),
    txMaxResultBytes: int(env, 'FENCEPOST_TX_MAX_RESULT_BYTES', TX_DEFAULTS.maxResultBytes, 1024, 1024 * 1024 * 1024),
    clientRole: clientRole(env),
    protectedPrefixRefreshMs: int(env, 'FENCEPOST_PROTECTED_PREFIX_REFRESH_MS', PROTECT_DEFAULTS.prefixRefreshMs, 100, 3_600_000),
    durabilityCheckMs: int(env, 'FENCEPOST_DURABILITY_CHECK_MS', DURABILITY_DEFAULTS.checkMs, 100, 3_600_000),
    requireSyncStandby: requireSyncRaw === '1',
  });
}
