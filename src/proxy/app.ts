// buildApp(): the fastify instance, with no listening, signals or database lifecycle (server.ts
// does those). Tests drive it with app.inject().
import Fastify, { LogController, type FastifyInstance, type FastifyError, type FastifyReply } from 'fastify';
import type { Logger } from 'pino';
import type { FenceStore } from '../fence/store.ts';
import { isUnavailable } from '../fence/pg-errors.ts';
import { ApiError } from './errors.ts';
import { objectRoutes } from './routes/objects.ts';
import { fenceRoutes } from './routes/fences.ts';
import { statsRoutes } from './routes/stats.ts';
import { healthRoutes } from './routes/health.ts';
import { ProxyMetrics, installMetrics } from './metrics.ts';
import { metricsRoutes } from './routes/metrics.ts';
import { rejectionRoutes } from './routes/rejections.ts';
import { dashboardRoutes } from './routes/dashboard.ts';

export interface AppOptions {
  store: FenceStore;
  bodyLimitBytes: number;
  logger?: Logger | false;
  /** Prometheus metrics; default: a fresh registry over `store.pool`. */
  metrics?: ProxyMetrics;
}

declare module 'fastify' {
  interface FastifyInstance {
    store: FenceStore;
    /** Set once shutdown begins: new requests get 503 unavailable. */
    closing: boolean;
  }
}

/** Body for every error: `{"error": code, "message": …, …extra}`. */
function toApiError(err: FastifyError | Error, url: string): ApiError {
  if (err instanceof ApiError) return err;
  const code = (err as FastifyError).code;
  if (code === 'FST_ERR_CTP_BODY_TOO_LARGE') return new ApiError('payload_too_large', err.message);
  if (code === 'FST_ERR_BAD_URL' && /^\/v1\/(objects|fences)\//.test(url)) {
    return new ApiError('invalid_key', 'key is not valid percent-encoded UTF-8');
  }
  if (isUnavailable(err)) return new ApiError('unavailable', 'database unavailable; safe to retry', {}, { cause: err });
  const status = (err as FastifyError).statusCode;
  if (status !== undefined && status >= 400 && status < 500) return new ApiError('bad_request', err.message);
  return new ApiError('internal', 'internal error; the write did not commit', {}, { cause: err });
}

function sendError(reply: FastifyReply, err: ApiError): void {
  if (err.code === 'unavailable') void reply.header('retry-after', '1');
  void reply.code(err.status).type('application/json').send(err.toJSON());
}

export function buildApp(opts: AppOptions): FastifyInstance {
  const app = Fastify({
    ...(opts.logger ? { loggerInstance: opts.logger } : { logger: false }),
    // Per-request lines cost throughput; rejections and errors are logged where they happen.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: opts.bodyLimitBytes,
    // 1024-byte keys percent-encoded take up to 3072 characters; longer ones get invalid_key.
    routerOptions: { maxParamLength: 16 * 1024 },
    return503OnClosing: false,
    // Bad percent-encoding and the like, before routing: answer in the registry's shape.
    frameworkErrors: (err, req, reply) => sendError(reply as unknown as FastifyReply, toApiError(err, req.url)),
  }) as unknown as FastifyInstance;
  app.decorate('store', opts.store);
  app.decorate('closing', false);
  installMetrics(app, opts.metrics ?? new ProxyMetrics(opts.store.pool));

  // Bodies are stored raw, whatever their content type.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));

  app.addHook('onRequest', async () => {
    if (app.closing) throw new ApiError('unavailable', 'proxy is shutting down; safe to retry');
  });

  app.setErrorHandler((err: FastifyError, req, reply) => {
    const apiErr = toApiError(err, req.url);
    if (apiErr.status >= 500) req.log.error({ err: apiErr.cause ?? err, code: apiErr.code }, 'request failed');
    sendError(reply, apiErr);
  });
  app.setNotFoundHandler((req, reply) => {
    sendError(reply, new ApiError('not_found', `no route ${req.method} ${req.url.split('?')[0]}`));
  });

  app.register(objectRoutes);
  app.register(fenceRoutes);
  app.register(statsRoutes);
  app.register(healthRoutes);
  app.register(metricsRoutes);
  app.register(rejectionRoutes);
  app.register(dashboardRoutes);
  return app;
}
