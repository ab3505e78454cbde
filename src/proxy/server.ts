// Running the proxy: embedded Postgres (when DATABASE_URL is unset), migrations, listen, and an
// orderly stop (stop accepting, finish in-flight writes, close the pool, stop Postgres).
import pg from 'pg';
import pino, { type Logger } from 'pino';
import type { FastifyInstance } from 'fastify';
import { buildApp } from './app.ts';
import { PGWIRE_DEFAULTS, STORE_DEFAULTS, assertSafeBind, type ProxyConfig } from './config.ts';
import { PgwireServer } from './pgwire/listener.ts';
import { FenceStore, type WriteStrategy } from '../fence/store.ts';
import { migrate } from '../fence/migrate.ts';
import type { RunningPostgres } from '../fence/embedded-postgres.ts';
import { RejectionPruner } from '../fence/retention.ts';
import { checkDurability, unknownDurability } from '../fence/durability.ts';
import { ProxyMetrics } from './metrics.ts';

export interface RunningProxy {
  app: FastifyInstance;
  url: string;
  databaseUrl: string;
  /** The SQL endpoint's port, when FENCEPOST_PGWIRE_PORT is set (else null: off). */
  pgwirePort: number | null;
  /** Idempotent. */
  close(): Promise<void>;
}

/** Bearer keys never reach the log, whatever logs a request or its headers. */
export const LOG_REDACT = { paths: ['req.headers.authorization', 'headers.authorization', 'authorization', 'err.headers.authorization'], censor: '[redacted]' };

export function createLogger(level: string): Logger {
  return pino({ level, base: { service: 'fencepost-proxy' }, redact: LOG_REDACT }, pino.destination(2));
}

/**
 * `statementTimeoutMs` bounds every statement server-side (a cancelled statement did not commit:
 * 503, safe to retry), and, 5 s later, client-side too, for a database that stopped answering.
 * `lockTimeoutMs` bounds every wait for a lock (55P03, nothing of the statement committed): the
 * proxy's main pool, so a fence row held by a long transaction fails only that fence's writes
 * (FenceStore splits the batch) instead of stalling the write slots. Set on the connection, not
 * per statement: one round trip per fenced write, not BEGIN, SET LOCAL, write and COMMIT.
 */
export function createPool(databaseUrl: string, max: number, opts: { statementTimeoutMs?: number; lockTimeoutMs?: number } = {}): pg.Pool {
  const timeout = opts.statementTimeoutMs ?? 0;
  const lockTimeout = opts.lockTimeoutMs ?? 0;
  const pool = new pg.Pool({
    connectionString: databaseUrl,
    max,
    connectionTimeoutMillis: 5000,
    idleTimeoutMillis: 30_000,
    // Every 200 means durably committed, whatever the database's default says.
    options: `-c synchronous_commit=on${timeout > 0 ? ` -c statement_timeout=${timeout}` : ''}${lockTimeout > 0 ? ` -c lock_timeout=${lockTimeout}` : ''}`,
    ...(timeout > 0 ? { query_timeout: timeout + 5000 } : {}),
  });
  // An idle client losing its connection must not crash the process; the next query reports it.
  pool.on('error', () => {});
  return pool;
}

/** Test seams, handed in only by tools/ (never from configuration). */
export interface ProxySeams {
  __test__writeStrategy?: WriteStrategy;
}

export async function startProxy(config: Readonly<ProxyConfig>, logger: Logger = createLogger(config.logLevel), seams: ProxySeams = {}): Promise<RunningProxy> {
  assertSafeBind(config); // before anything starts: no keys means loopback only, unless allowed
  let embedded: RunningPostgres | null = null;
  let databaseUrl = config.databaseUrl;
  if (databaseUrl === null) {
    logger.info({ dataDir: config.dataDir, port: config.embeddedPgPort }, 'starting embedded Postgres');
    // Loaded only here: with DATABASE_URL set, embedded-postgres (and its binaries) never load.
    const { startEmbeddedPostgres } = await import('../fence/embedded-postgres.ts');
    embedded = await startEmbeddedPostgres({
      dataDir: config.dataDir,
      port: config.embeddedPgPort,
      log: (line) => logger.debug({ postgres: line }),
    });
    databaseUrl = embedded.url;
  }
  const pool = createPool(databaseUrl, config.poolSize, { statementTimeoutMs: config.statementTimeoutMs, lockTimeoutMs: config.lockTimeoutMs });
  const metrics = new ProxyMetrics(pool);
  const store = new FenceStore(pool, {
    ...STORE_DEFAULTS,
    concurrency: config.writeConcurrency,
    maxBatch: config.maxBatch,
    onBatch: (n) => metrics.writeBatchSize.observe(n),
    ...(seams.__test__writeStrategy ? { __test__writeStrategy: seams.__test__writeStrategy } : {}),
  });
  const app = buildApp({
    store,
    bodyLimitBytes: config.bodyLimitBytes,
    logger,
    metrics,
    auth: { keys: config.keys, readAccess: config.readAccess },
    forgeryGuard: config.forgeryGuard,
    browser: { allowedOrigins: config.allowedOrigins, allowedHosts: config.allowedHosts },
    transactions: {
      databaseUrl,
      clientRole: config.clientRole,
      maxConcurrent: config.txPoolSize,
      maxStatements: config.txMaxStatements,
      statementTimeoutMs: config.txStatementTimeoutMs,
      lockTimeoutMs: config.lockTimeoutMs,
      transactionTimeoutMs: config.txTimeoutMs,
      maxResultBytes: config.txMaxResultBytes,
      retries: config.txRetries,
    },
    requestTimeoutMs: config.requestTimeoutMs,
  });
  if (config.keys.length === 0) logger.warn({ host: config.host }, 'no keys configured: the proxy is open to anyone who can reach it');
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
      : new PgwireServer({
          host: config.host,
          port: config.pgwirePort,
          databaseUrl,
          keys: config.keys,
          provision: () => app.transactionRunner.provision(),
          owner: pool,
          statementTimeoutMs: config.txStatementTimeoutMs,
          lockTimeoutMs: config.lockTimeoutMs,
          maxConnections: config.pgwireMaxConnections,
          startupTimeoutMs: PGWIRE_DEFAULTS.startupTimeoutMs,
          logger: logger.child({ component: 'pgwire' }),
        });
  let pgwirePort: number | null = null;
  try {
    const applied = await migrate(pool);
    if (applied.length > 0) logger.info({ applied }, 'migrations applied');
    const durability = await checkDurability(pool).catch((err: unknown) => {
      logger.warn({ err }, 'durability check failed');
      return unknownDurability();
    });
    for (const warning of durability.warnings) logger.warn({ component: 'durability' }, warning);
    // Client logins for SQL transactions: created now, or the log says what to run (see Security).
    await app.transactionRunner.provision();
    await app.listen({ host: config.host, port: config.port });
    if (pgwire) pgwirePort = await pgwire.listen();
    pruner.start(); // after migrate: the table exists
  } catch (err) {
    await pgwire?.close().catch(() => {});
    await pruner.stop().catch(() => {});
    await app.close().catch(() => {});
    await pool.end().catch(() => {});
    await embedded?.stop().catch(() => {});
    throw err;
  }
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.port;
  const url = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`;
  logger.info({ url, embeddedPostgres: embedded !== null }, 'fencepost proxy listening');
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
      await store.idle();
      await pruner.stop();
      await pool.end();
      await embedded?.stop();
      logger.info('stopped');
    })());
  return { app, url, databaseUrl, pgwirePort, close };
}
