// With FENCEPOST_REQUIRE_SYNC_STANDBY=1, the HTTP door refuses every write (each route with a
// `config.operation`: object writes, PUT /v1/fences, POST /v1/transactions) while the durability
// monitor (src/fence/durability-monitor.ts) says a Postgres failover could lose a fence raise:
// 503 durability_unsafe, before the request reaches the database, so nothing committed. Reads go on.
import type { FastifyInstance } from 'fastify';
import type { DurabilityMonitor } from '../../fence/admin.ts';
import { ApiError } from '../errors.ts';
import './route-config.ts'; // config.operation

/** The answer while writes are refused (GET /readyz's too, with the report added). */
export function durabilityUnsafe(
  refusal: { reasons: readonly string[]; warnings: readonly string[] },
  extra: Record<string, unknown> = {},
): ApiError {
  return new ApiError(
    'durability_unsafe',
    `writes are refused while a Postgres failover could lose a fence raise (FENCEPOST_REQUIRE_SYNC_STANDBY=1): ${refusal.reasons.join(', ')}; nothing committed, safe to retry`,
    { reasons: refusal.reasons, warnings: refusal.warnings, ...extra },
  );
}

/** After authentication and validation: a refused write answers the registry's error. */
export function registerDurabilityGate(app: FastifyInstance, monitor: DurabilityMonitor): void {
  app.addHook('preHandler', async (req) => {
    if (req.routeOptions.config.operation === undefined) return;
    const refusal = monitor.refusal();
    if (refusal !== null) throw durabilityUnsafe(refusal);
  });
}
