// Prometheus metrics for one proxy instance, on a registry of its own (tests build many apps in
// one process; prom-client's global registry would mix them up).
//
// Every door is counted the same way, in fencepost_writes_total{door, operation, outcome}:
// - `http` (object writes and fences) and `transaction` (POST /v1/transactions): an onResponse
//   hook keyed on the route's `config.operation` and the status code (observe below).
// - `sql` (the SQL endpoint): one count per fenced transaction when it ends, from the relay
//   (proxy/sql/relay.ts: the fence passed, then the backend's COMMIT or end of the implicit
//   transaction, as the database counts it in pending_counts), and one rejected per FP409 refusal
//   (the same refusal the listener records in the rejection log).
// So `accepted` summed over doors is what the database counts as accepted, and `rejected` what it
// counts as rejected (fence_stats, /v1/stats), as long as each rejection was recorded: the ones
// the rejection log could not record are counted in fencepost_rejections_unrecorded_total.
// No SQL and no per-key work on the write path. Labels are bounded sets only (door, operation,
// outcome, reason, route pattern, status code): never a fence key, object key or writer id, whose
// number is unbounded. Per-fence numbers come from the database (/v1/stats, the dashboard).
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type pg from 'pg';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { processMetrics } from '../metrics/process.ts';
import { type Door, type OpKind } from '../fence/index.ts';
import { DURABILITY_REASONS, type DurabilityMonitor } from '../fence/admin.ts';
import './http/route-config.ts'; // config.operation

export type { Door };
export type WriteOperation = OpKind | 'transaction';
/**
 * rolled_back: the SQL endpoint only, a fenced transaction the writer rolled back (or left by
 * closing its connection): nothing was asked to commit.
 */
export type WriteOutcome = 'accepted' | 'rejected' | 'precondition_failed' | 'invalid' | 'rolled_back' | 'error';
export type RejectionReason = 'stale_token' | 'unverified_token';

/** Every label value of fencepost_writes_total: each door's combinations exist (at 0) from the start. */
export const DOORS = ['http', 'transaction', 'sql'] as const satisfies readonly Door[];
export const WRITE_OPERATIONS = ['put', 'delete', 'fence', 'transaction'] as const satisfies readonly WriteOperation[];
export const WRITE_OUTCOMES = [
  'accepted',
  'rejected',
  'precondition_failed',
  'invalid',
  'rolled_back',
  'error',
] as const satisfies readonly WriteOutcome[];
export const REJECTION_REASONS = ['stale_token', 'unverified_token'] as const satisfies readonly RejectionReason[];
/** What each door can answer: the series exposed at 0 from the start. */
export const DOOR_SERIES: Readonly<Record<Door, { operations: readonly WriteOperation[]; outcomes: readonly WriteOutcome[] }>> = {
  http: { operations: ['put', 'delete', 'fence'], outcomes: ['accepted', 'rejected', 'precondition_failed', 'invalid', 'error'] },
  transaction: { operations: ['transaction'], outcomes: ['accepted', 'rejected', 'invalid', 'error'] },
  sql: { operations: ['transaction'], outcomes: ['accepted', 'rejected', 'invalid', 'rolled_back', 'error'] },
};

declare module 'fastify' {
  interface FastifyInstance {
    metrics: ProxyMetrics;
  }
}

const SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

export class ProxyMetrics {
  readonly registry = new Registry();
  private readonly includeProcess: boolean;

  readonly writes = new Counter({
    name: 'fencepost_writes_total',
    help: 'Fenced writes answered, by door (http, transaction: POST /v1/transactions, sql: the SQL endpoint), operation (put, delete, fence, transaction) and outcome: accepted (2xx; sql: committed), rejected (stale_token or unverified_token; sql: FP409), precondition_failed (412), invalid (other 4xx; sql: failed on its own error), rolled_back (sql: rolled back by the writer), error (5xx; sql: the database connection lost mid-transaction).',
    labelNames: ['door', 'operation', 'outcome'] as const,
    registers: [this.registry],
    // SQL transactions ended since the last read (countSqlTransaction), added now.
    collect: () => this.addSqlTransactions(),
  });

  /**
   * SQL transaction ends not yet added to `writes`, by outcome: every fenced transaction ends one,
   * and prom-client builds a key from the labels at each inc (a few microseconds per transaction
   * on the SQL endpoint's path); added when the counter is read.
   */
  private readonly sqlTransactions = { accepted: 0, invalid: 0, rolled_back: 0, error: 0 };

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

  readonly rejections = new Counter({
    name: 'fencepost_rejections_total',
    help: 'Writes refused by a fence, by door and reason (stale_token: below the fence; unverified_token: the forgery guard did not find the token in ZooKeeper).',
    labelNames: ['door', 'reason'] as const,
    registers: [this.registry],
  });

  readonly rejectionsUnrecorded = new Counter({
    name: 'fencepost_rejections_unrecorded_total',
    help: 'Rejections the rejection log could not record (the database failed): refused all the same, but missing from the database counts, /v1/stats and /v1/rejections.',
    labelNames: ['door'] as const,
    registers: [this.registry],
  });

  readonly rejectionsPruned = new Counter({
    name: 'fencepost_rejection_log_pruned_total',
    help: 'Rows this instance deleted from the rejection log under the retention limits.',
    registers: [this.registry],
  });

  constructor(pool: pg.Pool, opts: { processMetrics?: boolean; durability?: DurabilityMonitor } = {}) {
    this.includeProcess = opts.processMetrics ?? true;
    // A series that first appears at 1 is invisible to increase() and rate(): the first rejection
    // after a start would fire no alert. So every operation × outcome starts at 0.
    for (const door of DOORS) {
      for (const operation of DOOR_SERIES[door].operations)
        for (const outcome of DOOR_SERIES[door].outcomes) this.writes.inc({ door, operation, outcome }, 0);
      for (const reason of REJECTION_REASONS) this.rejections.inc({ door, reason }, 0);
      this.rejectionsUnrecorded.inc({ door }, 0);
    }
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
    gauge(
      'fencepost_db_pool_waiting_requests',
      'Queries waiting for a pool connection (above 0 for long = pool too small or the database slow).',
      () => pool.waitingCount,
    );
    gauge('fencepost_db_pool_max_connections', 'Pool size limit (FENCEPOST_POOL_SIZE).', () => pool.options.max ?? 10);
    if (opts.durability) this.durabilityGauges(opts.durability);
  }

  /** The durability monitor's latest report (no query at scrape time); every reason's series exists from the start. */
  private durabilityGauges(monitor: DurabilityMonitor): void {
    const registers = [this.registry];
    new Gauge({
      name: 'fencepost_fence_durability_unsafe',
      help: 'Whether the latest durability check found this reason a Postgres failover could lose a fence raise (1) or not (0): synchronous_commit_below_on, async_standby, no_sync_standby_streaming (writes hang), waiting_on_standby, no_sync_standby (FENCEPOST_REQUIRE_SYNC_STANDBY only), check_failed.',
      labelNames: ['reason'] as const,
      registers,
      collect() {
        const reasons = new Set(monitor.latest()?.reasons ?? []);
        for (const reason of DURABILITY_REASONS) this.set({ reason }, reasons.has(reason) ? 1 : 0);
      },
    });
    const count = (name: string, help: string, read: () => number | 'unknown' | undefined) =>
      new Gauge({
        name,
        help,
        registers,
        collect() {
          const n = read();
          this.set(typeof n === 'number' ? n : NaN);
        },
      });
    count(
      'fencepost_fence_durability_sync_standbys',
      'Synchronous standbys streaming from the database (sync_state sync or quorum), at the latest durability check; NaN: unknown.',
      () => {
        const standbys = monitor.latest()?.standbys;
        // sync_state reads null without pg_read_all_stats: not known then.
        return standbys === undefined || standbys === 'unknown' || standbys.some((s) => s.syncState === 'unknown')
          ? 'unknown'
          : standbys.filter((s) => s.state === 'streaming' && (s.syncState === 'sync' || s.syncState === 'quorum')).length;
      },
    );
    count(
      'fencepost_fence_durability_waiting_backends',
      'Backends waiting 1 s or more for a synchronous standby to confirm their commit (wait_event SyncRep), at the latest durability check; NaN: unknown.',
      () => monitor.latest()?.waitingOnStandby,
    );
    count(
      'fencepost_fence_durability_refusing_writes',
      'Whether this proxy refuses writes now (1) because a failover could lose a fence raise (FENCEPOST_REQUIRE_SYNC_STANDBY=1), or not (0).',
      () => (monitor.refusal() === null ? 0 : 1),
    );
  }

  /** Called for every response; cheap (a few map lookups). */
  observe(req: FastifyRequest, reply: FastifyReply): void {
    const route = req.routeOptions.url ?? 'unmatched';
    const status = reply.statusCode;
    this.httpRequests.inc({ method: req.method, route, status: String(status) });
    const operation = req.routeOptions.config.operation;
    if (operation === undefined) return;
    const code = reply.errorCode;
    const rejected = code === 'stale_token' || code === 'unverified_token';
    const outcome: WriteOutcome =
      status < 400
        ? 'accepted'
        : rejected
          ? 'rejected'
          : code === 'precondition_failed'
            ? 'precondition_failed'
            : status < 500
              ? 'invalid'
              : 'error';
    const door: Door = operation === 'transaction' ? 'transaction' : 'http';
    this.countWrite(door, operation, outcome);
    if (rejected) this.rejections.inc({ door, reason: code });
    this.writeDuration.observe({ operation, outcome }, reply.elapsedTime / 1000);
  }

  /** One write (HTTP: a request; sql: a fenced transaction) answered at `door`. */
  countWrite(door: Door, operation: WriteOperation, outcome: WriteOutcome): void {
    this.writes.inc({ door, operation, outcome });
  }

  /** One fenced transaction of the SQL endpoint ended so (its refusals: countSqlRejection). */
  countSqlTransaction(outcome: keyof ProxyMetrics['sqlTransactions']): void {
    this.sqlTransactions[outcome]++;
  }

  private addSqlTransactions(): void {
    const ends = this.sqlTransactions;
    for (const outcome of ['accepted', 'invalid', 'rolled_back', 'error'] as const) {
      if (ends[outcome] > 0) this.writes.inc({ door: 'sql', operation: 'transaction', outcome }, ends[outcome]);
      ends[outcome] = 0;
    }
  }

  /** One refusal at the SQL endpoint (FP409): rejected, with its reason. */
  countSqlRejection(reason: RejectionReason): void {
    this.writes.inc({ door: 'sql', operation: 'transaction', outcome: 'rejected' });
    this.rejections.inc({ door: 'sql', reason });
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
  // Rejections the log could not record, whichever door refused them (the store's log is shared).
  const unwatch = app.fence.onUnrecordedRefusals((door, count) => metrics.rejectionsUnrecorded.inc({ door }, count));
  app.addHook('onClose', async () => unwatch());
  app.addHook('onResponse', async (req, reply) => {
    metrics.observe(req, reply);
  });
}
