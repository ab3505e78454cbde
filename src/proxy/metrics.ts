// Prometheus metrics for one proxy instance, on a registry of its own (tests build many apps in
// one process; prom-client's global registry would mix them up).
//
// Write counts come from an onResponse hook keyed on the route's `config.operation` and the
// status code: no SQL and no per-key work on the write path. Labels are bounded sets only
// (operation, outcome, route pattern, status code): never a fence key, object key or writer id,
// whose number is unbounded. Per-fence numbers come from the database (/v1/stats, the dashboard).
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type pg from 'pg';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { OpKind } from '../fence/queries.ts';
import './http/route-config.ts'; // config.operation

export type WriteOutcome = 'accepted' | 'rejected' | 'precondition_failed' | 'invalid' | 'error';

/** Every label value of fencepost_writes_total: each combination exists (at 0) from the start. */
export const WRITE_OPERATIONS = ['put', 'delete', 'fence', 'transaction'] as const satisfies readonly (OpKind | 'transaction')[];
export const WRITE_OUTCOMES = ['accepted', 'rejected', 'precondition_failed', 'invalid', 'error'] as const satisfies readonly WriteOutcome[];

declare module 'fastify' {
  interface FastifyInstance {
    metrics: ProxyMetrics;
  }
}

// Process metrics (CPU, memory, event loop, GC, handles) describe the process, not an app, and
// prom-client's collectors install observers that cannot be removed: collect them once per
// process on a registry of their own, merged into each app's output at scrape time.
let processRegistry: Registry | null = null;
function processMetrics(): Registry {
  if (processRegistry === null) {
    processRegistry = new Registry();
    collectDefaultMetrics({ register: processRegistry });
  }
  return processRegistry;
}

const SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

export class ProxyMetrics {
  readonly registry = new Registry();
  private readonly includeProcess: boolean;

  readonly writes = new Counter({
    name: 'fencepost_writes_total',
    help: 'Fenced writes answered, by operation (put, delete, fence, transaction) and outcome: accepted (2xx), rejected (stale_token or unverified_token), precondition_failed (412), invalid (other 4xx), error (5xx).',
    labelNames: ['operation', 'outcome'] as const,
    registers: [this.registry],
  });

  readonly writeDuration = new Histogram({
    name: 'fencepost_write_duration_seconds',
    help: 'Time from request to response of fenced writes, by operation and outcome.',
    labelNames: ['operation', 'outcome'] as const,
    buckets: SECONDS_BUCKETS,
    registers: [this.registry],
  });

  readonly writeBatchSize = new Histogram({
    name: 'fencepost_write_batch_size',
    help: 'Writes coalesced into one fenced statement.',
    buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
    registers: [this.registry],
  });

  readonly httpRequests = new Counter({
    name: 'fencepost_http_requests_total',
    help: 'HTTP responses by method, route pattern (never the key itself) and status code.',
    labelNames: ['method', 'route', 'status'] as const,
    registers: [this.registry],
  });

  readonly rejectionsPruned = new Counter({
    name: 'fencepost_rejection_log_pruned_total',
    help: 'Rows this instance deleted from the rejection log under the retention limits.',
    registers: [this.registry],
  });

  constructor(pool: pg.Pool, opts: { processMetrics?: boolean } = {}) {
    this.includeProcess = opts.processMetrics ?? true;
    // A series that first appears at 1 is invisible to increase() and rate(): the first rejection
    // after a start would fire no alert. So every operation × outcome starts at 0.
    for (const operation of WRITE_OPERATIONS) for (const outcome of WRITE_OUTCOMES) this.writes.inc({ operation, outcome }, 0);
    const gauge = (name: string, help: string, read: () => number) =>
      new Gauge({
        name,
        help,
        registers: [this.registry],
        collect() {
          this.set(read());
        },
      });
    gauge('fencepost_db_pool_connections', 'Postgres connections open in the pool (idle and in use).', () => pool.totalCount);
    gauge('fencepost_db_pool_idle_connections', 'Open Postgres connections not in use.', () => pool.idleCount);
    gauge('fencepost_db_pool_waiting_requests', 'Queries waiting for a pool connection (above 0 for long = pool too small or the database slow).', () => pool.waitingCount);
    gauge('fencepost_db_pool_max_connections', 'Pool size limit (FENCEPOST_POOL_SIZE).', () => pool.options.max ?? 10);
  }

  /** Called for every response; cheap (a few map lookups). */
  observe(req: FastifyRequest, reply: FastifyReply): void {
    const route = req.routeOptions.url ?? 'unmatched';
    const status = reply.statusCode;
    this.httpRequests.inc({ method: req.method, route, status: String(status) });
    const operation = req.routeOptions.config.operation;
    if (operation === undefined) return;
    const code = reply.errorCode;
    const outcome: WriteOutcome =
      status < 400 ? 'accepted' : code === 'stale_token' || code === 'unverified_token' ? 'rejected' : code === 'precondition_failed' ? 'precondition_failed' : status < 500 ? 'invalid' : 'error';
    this.writes.inc({ operation, outcome });
    this.writeDuration.observe({ operation, outcome }, reply.elapsedTime / 1000);
  }

  readonly contentType = Registry.PROMETHEUS_CONTENT_TYPE;

  /** The exposition text: this app's metrics, then the process's. */
  async text(): Promise<string> {
    const registries = this.includeProcess ? [this.registry, processMetrics()] : [this.registry];
    return await Registry.merge(registries).metrics();
  }
}

/** Decorates `app.metrics` and counts every response. Called on the root instance, not as a plugin. */
export function installMetrics(app: FastifyInstance, metrics: ProxyMetrics): void {
  app.decorate('metrics', metrics);
  app.addHook('onResponse', async (req, reply) => {
    metrics.observe(req, reply);
  });
}
