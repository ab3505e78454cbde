// buildApp(): the fastify instance, with no listening, signals or database lifecycle (server.ts
// does those). Tests drive it with app.inject().
import type pg from 'pg';
import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import Fastify, { LogController, type FastifyInstance, type FastifyError, type FastifyReply } from 'fastify';
import type { Logger } from 'pino';
import {
  type Fence,
  isUnavailable,
  sqlState,
  NoWritableHostError,
  NOT_FENCED,
  FenceHeldByPreparedError,
  WriteOutcomeUnknownError,
  SQLSTATE,
} from '../../fence/index.ts';
import { type FenceStore, DurabilityMonitor } from '../../fence/admin.ts';
import { ApiError } from '../errors.ts';
import { objectRoutes } from './routes/objects.ts';
import { fenceRoutes } from './routes/fences.ts';
import { electionRoutes } from './routes/elections.ts';
import { statsRoutes } from './routes/stats.ts';
import { healthRoutes } from './routes/health.ts';
import { ProxyMetrics, installMetrics } from '../metrics.ts';
import { metricsRoutes } from './routes/metrics.ts';
import { rejectionRoutes } from './routes/rejections.ts';
import { dashboardRoutes } from './routes/dashboard.ts';
import { registerAuth, type AuthConfig } from './auth.ts';
import { registerBrowserGuard, type BrowserConfig } from './browser-guard.ts';
import type { ForgeryGuard, ForgeryGuardConfig } from '../forgery-guard.ts';
import { buildSharedParts, closeSharedParts, type SharedParts } from '../shared.ts';
import { transactionRoutes, transactionSettings, type TransactionOptions } from './routes/transactions.ts';
import { LOG_DEFAULTS, PROTECT_DEFAULTS, TX_DEFAULTS } from '../config.ts';
import type { StaleDigest } from '../../logging/stale-digest.ts';
import { RepeatLimiter } from '../../logging/repeat-limiter.ts';
import { AJV_OPTIONS, schemaErrorFormatter } from './validation.ts';
import { REQUEST_ID_HEADER, registerRequestId, requestId } from './request-id.ts';
import { registerOpenApi } from './openapi.ts';
import type { TlsPem } from '../access/tls.ts';
import { docsRoutes } from './routes/docs.ts';
import { registerDurabilityGate } from './durability-gate.ts';

export interface AppOptions {
  store: FenceStore;
  bodyLimitBytes: number;
  logger?: Logger | false;
  /** Prometheus metrics; default: a fresh registry over `store.pool`. */
  metrics?: ProxyMetrics;
  /** Bearer keys and read access; default: no keys (open). */
  auth?: AuthConfig;
  /**
   * The parts every door shares (shared.ts: the fence, the forgery guard, the stale log), built and
   * closed by the caller (server.ts). Default: built from these options and closed with the app.
   */
  shared?: SharedParts;
  /** Token forgery guard, when the app builds its shared parts; default: off. */
  forgeryGuard?: ForgeryGuardConfig | null;
  /** POST /v1/transactions; defaults: TX_DEFAULTS, client logins on the database of `store.pool`. */
  transactions?: Partial<Omit<TransactionOptions, 'keys'>>;
  /** Headers and body must arrive within this, else 408 request_timeout. Default 30 000. */
  requestTimeoutMs?: number;
  /** Pages that may call the proxy, and host names it answers to in open mode; default: none. */
  browser?: BrowserConfig;
  /** Serve HTTPS only, with this certificate and key (TlsMaterial.pem()); default: plain HTTP. */
  https?: TlsPem;
  /**
   * How often the protected object-key prefixes are read again (`store.protectedPrefixes`; first
   * read when the app is ready); default PROTECT_DEFAULTS.prefixRefreshMs.
   */
  protectedPrefixRefreshMs?: number;
  /** How stale rejections and repeated errors are kept short in the log; default LOG_DEFAULTS. */
  logDigest?: Partial<Record<keyof typeof LOG_DEFAULTS, number>>;
  /**
   * The durability monitor (started and stopped by its owner, server.ts): GET /readyz reports its
   * latest report, and every write is refused while it refuses (FENCEPOST_REQUIRE_SYNC_STANDBY).
   * Default: one with no timer and no refusal (GET /readyz checks afresh).
   */
  durability?: DurabilityMonitor;
}

declare module 'fastify' {
  interface FastifyInstance {
    /** Set once shutdown begins: new requests get 503 unavailable. */
    closing: boolean;
    /** Null when the forgery guard is off. */
    forgeryGuard: ForgeryGuard | null;
    /** Stale rejections in the log, summed per interval (every door's: the SQL endpoint logs into it too). */
    staleLog: StaleDigest;
    /** Whether a Postgres failover keeps every fence raise (durability-monitor.ts). */
    durability: DurabilityMonitor;
    /** The fence every door calls (src/fence/fence.ts): raises, client logins, where refusals and commits go. */
    fence: Fence;
  }
}

/**
 * Errors node's HTTP parser raises before fastify sees a request (oversized headers, a request
 * that does not arrive within requestTimeout, garbage): answered in the registry's shape, then
 * the connection is closed.
 */
function clientErrorHandler(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const apiErr =
    err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? new ApiError('request_timeout', 'the request did not arrive in time')
      : err.code === 'HPE_HEADER_OVERFLOW'
        ? new ApiError('headers_too_large', 'request headers are over 16 KiB')
        : new ApiError('bad_request', 'malformed HTTP request');
  const body = JSON.stringify(apiErr.toJSON());
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${apiErr.status} ${STATUS_CODES[apiErr.status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy();
}

/** Body for every error: `{"error": code, "message": …, …extra}`. */
function toApiError(err: FastifyError | Error, url: string): ApiError {
  if (err instanceof ApiError) return err;
  const code = (err as FastifyError).code;
  if (code === 'FST_ERR_CTP_BODY_TOO_LARGE') return new ApiError('payload_too_large', err.message);
  if (code === 'FST_ERR_BAD_URL' && /^\/v1\/(objects|fences)\//.test(url)) {
    return new ApiError('invalid_key', 'key is not valid percent-encoded UTF-8');
  }
  // A row (a fence) locked by another session past FENCEPOST_LOCK_TIMEOUT_MS: the statement rolled back.
  // The protected-prefix trigger refused an object write (routes/objects.ts answers the ones it
  // expects with the prefix named): the statement rolled back.
  if (sqlState(err) === NOT_FENCED) return new ApiError('not_fenced', `${err.message}; nothing written`, {}, { cause: err });
  // A prepared transaction holds the fence row: no retry outwaits it; the answer names it.
  if (err instanceof FenceHeldByPreparedError) {
    return new ApiError(
      'unavailable',
      `${err.message}; nothing committed`,
      { fenceKey: err.fenceKey, preparedTransaction: err.preparedTransaction },
      { cause: err },
    );
  }
  if (sqlState(err) === SQLSTATE.LOCK_NOT_AVAILABLE)
    return new ApiError('unavailable', 'fence busy (locked by another transaction); nothing committed, safe to retry', {}, { cause: err });
  if (err instanceof WriteOutcomeUnknownError)
    return new ApiError('commit_unknown', `${err.message}: read back before retrying`, {}, { cause: err });
  // DATABASE_URL lists several hosts and none takes writes now (a failover under way): say which.
  if (err instanceof NoWritableHostError)
    return new ApiError('unavailable', `database unavailable: ${err.message}; nothing committed, safe to retry`, {}, { cause: err });
  if (isUnavailable(err)) return new ApiError('unavailable', 'database unavailable; safe to retry', {}, { cause: err });
  // A standby, or a primary still promoting: nothing can have committed, and it passes.
  if (sqlState(err) === SQLSTATE.READ_ONLY_SQL_TRANSACTION)
    return new ApiError(
      'unavailable',
      'the database is read-only (a standby, or a primary still promoting); nothing committed, safe to retry',
      {},
      { cause: err },
    );
  const status = (err as FastifyError).statusCode;
  if (status !== undefined && status >= 400 && status < 500) return new ApiError('bad_request', err.message);
  return new ApiError('internal', 'internal error; the write may not have committed: read it back or retry', {}, { cause: err });
}

function sendError(reply: FastifyReply, err: ApiError): void {
  reply.errorCode = err.code;
  if (err.code === 'unavailable' || err.code === 'durability_unsafe') void reply.header('retry-after', '1');
  if (err.code === 'unauthorized') void reply.header('www-authenticate', 'Bearer');
  void reply.code(err.status).type('application/json').send(err.toJSON());
}

export function buildApp(opts: AppOptions): FastifyInstance {
  const requestTimeoutMs = opts.requestTimeoutMs ?? 30_000;
  const app = Fastify({
    ...(opts.logger ? { loggerInstance: opts.logger } : { logger: false }),
    // Per-request lines cost throughput; rejections and errors are logged where they happen.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: opts.bodyLimitBytes,
    // 1024-byte keys percent-encoded take up to 3072 characters; longer ones get invalid_key.
    routerOptions: { maxParamLength: 16 * 1024 },
    return503OnClosing: false,
    // A slow (or stalled) body cannot hold a connection longer than requestTimeoutMs; node checks
    // every connectionsCheckingInterval.
    requestTimeout: requestTimeoutMs,
    http: {
      headersTimeout: Math.min(requestTimeoutMs, 60_000),
      connectionsCheckingInterval: Math.min(1000, Math.max(100, Math.floor(requestTimeoutMs / 4))),
    },
    clientErrorHandler,
    ...(opts.https ? { https: { cert: opts.https.cert, key: opts.https.key } } : {}),
    // Bad percent-encoding and the like, before routing: answer in the registry's shape.
    frameworkErrors: (err, req, reply) =>
      sendError((reply as unknown as FastifyReply).header(REQUEST_ID_HEADER, req.id), toApiError(err, req.url)),
    // Every request's id (request-id.ts): the client's X-Request-Id when sane, else generated.
    genReqId: requestId,
    // Route schemas validate bodies, querystrings, params and headers; failures are registry errors.
    ajv: AJV_OPTIONS,
    schemaErrorFormatter,
  }) as unknown as FastifyInstance;
  app.decorate('closing', false);
  const durability = opts.durability ?? new DurabilityMonitor(opts.store.pool, { intervalMs: 0, requireSyncStandby: false, logger: null });
  app.decorate('durability', durability);
  app.decorateReply('errorCode', null);
  const tx = {
    ...TX_DEFAULTS,
    database: (opts.store.pool as unknown as { options: pg.ClientConfig }).options,
    ...opts.transactions,
    keys: opts.auth?.keys ?? [],
  };
  const shared =
    opts.shared ??
    buildSharedParts({
      store: opts.store,
      transactions: transactionSettings(tx),
      keys: opts.auth?.keys ?? [],
      clientRole: opts.transactions?.clientRole,
      raiseWaitMs: opts.transactions?.raiseWaitMs,
      lockTimeoutMs: opts.transactions?.lockTimeoutMs,
      provisionRetryMs: opts.transactions?.provisionRetryMs,
      forgeryGuard: opts.forgeryGuard ?? null,
      logDigest: opts.logDigest,
      logger: opts.logger || null,
    });
  if (!opts.shared) app.addHook('onClose', async () => await closeSharedParts(shared));
  app.decorate('fence', shared.fence);
  app.decorate('forgeryGuard', shared.guard);
  const logs = { ...LOG_DEFAULTS, ...opts.logDigest };
  // 5xx answers: the first of a kind with its message (the stack at debug), then a count per window.
  const failures = new RepeatLimiter(opts.logger || null, { windowMs: logs.repeatWindowMs, maxKinds: logs.repeatMaxKinds });
  app.decorate('staleLog', shared.staleLog);
  app.addHook('onClose', async () => failures.flush());
  // The protected prefixes are read when the app starts (not awaited: a pool with no free
  // connection must not hold the start), then kept fresh. A read that fails or comes late is no
  // reason not to serve: Postgres refuses a misfenced object whatever the copy holds, and each
  // refusal reads the list again.
  let stopRefreshing = () => {};
  app.addHook('onReady', async () => {
    void shared.fence.protectedPrefixes.refresh().catch((err: unknown) => {
      if (opts.logger)
        opts.logger.warn({ err }, 'reading the protected prefixes failed; they are read again on the interval and after a refused write');
    });
    stopRefreshing = shared.fence.protectedPrefixes.refreshing(
      opts.protectedPrefixRefreshMs ?? PROTECT_DEFAULTS.prefixRefreshMs,
      opts.logger || undefined,
    );
  });
  app.addHook('onClose', async () => stopRefreshing());
  registerRequestId(app);
  installMetrics(app, opts.metrics ?? new ProxyMetrics(opts.store.pool, { durability }));

  // Object bodies are stored raw, whatever their content type. POST /v1/transactions parses its
  // JSON body with a parser of its own (routes/transactions.ts).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));

  app.addHook('onRequest', async () => {
    if (app.closing) throw new ApiError('unavailable', 'proxy is shutting down; safe to retry');
  });
  // Before auth and before any route: foreign pages are refused first; POST routes take JSON only.
  registerBrowserGuard(app, opts.browser ?? { allowedOrigins: [], allowedHosts: [] }, { open: (opts.auth?.keys.length ?? 0) === 0 });
  registerAuth(app, opts.auth ?? { keys: [], readAccess: 'open' });
  registerDurabilityGate(app, durability);

  app.setErrorHandler((err: FastifyError, req, reply) => {
    const apiErr = toApiError(err, req.url);
    if (apiErr.status >= 500) {
      const cause = apiErr.cause ?? err;
      const kind = `${apiErr.code}:${(cause as { code?: unknown }).code ?? (cause instanceof Error ? cause.name : '')}`;
      failures.log('error', kind, { code: apiErr.code }, cause, 'request failed', { reqId: req.id, route: req.routeOptions.url ?? null });
    }
    sendError(reply, apiErr);
  });
  app.setNotFoundHandler((req, reply) => {
    sendError(reply, new ApiError('not_found', `no route ${req.method} ${req.url.split('?')[0]}`));
  });

  // Before the routes: @fastify/swagger documents each route as it is added.
  registerOpenApi(app, opts.auth ?? { keys: [], readAccess: 'open' });
  app.register(docsRoutes);
  app.register(objectRoutes);
  app.register(fenceRoutes);
  app.register(statsRoutes);
  app.register(electionRoutes);
  app.register(healthRoutes);
  app.register(metricsRoutes);
  app.register(rejectionRoutes);
  app.register(dashboardRoutes);
  app.register(transactionRoutes, { maxStatements: tx.maxStatements });
  return app;
}
