// GET /healthz (the process answers) and GET /readyz (database reachable, migrations applied, the
// database takes writes; with `durability`, the durability monitor's latest report: failover
// warnings, which make it unready only while writes are refused for them, FENCEPOST_REQUIRE_SYNC_STANDBY).
import type { FastifyInstance } from 'fastify';
import { NoWritableHostError, type FenceHealth } from '../../../fence/index.ts';
import { ApiError } from '../../errors.ts';
import { durabilityUnsafe } from '../durability-gate.ts';

export async function healthRoutes(app: FastifyInstance): Promise<void> {
  app.get('/healthz', { config: { access: 'open' }, schema: { summary: 'Liveness: the process answers' } }, async () => ({ status: 'ok' }));
  app.get(
    '/readyz',
    {
      config: { access: 'open' },
      schema: {
        summary:
          'Readiness: database reachable, migrations applied; `durability` lists failover warnings (unready for them only with FENCEPOST_REQUIRE_SYNC_STANDBY=1)',
      },
    },
    async () => {
      let health: FenceHealth;
      try {
        health = await app.fence.health();
      } catch (err) {
        // Several hosts in DATABASE_URL: the reason names each and why it does not fit.
        throw new ApiError(
          'unavailable',
          err instanceof NoWritableHostError ? `database unreachable: ${err.message}` : 'database unreachable',
          {},
          { cause: err },
        );
      }
      if (!health.migrated) throw new ApiError('unavailable', 'migrations not applied');
      // A standby (or a primary set read-only) answers reads and refuses every write: not ready.
      if (health.recovery) throw new ApiError('unavailable', 'the database is in recovery (a standby): it takes no writes');
      if (health.readOnly)
        throw new ApiError('unavailable', 'the database is read-only (default_transaction_read_only): it takes no writes');
      // The monitor's latest report (a check of its own only when no timer runs: buildApp without one).
      const durability = await app.durability.report();
      const refusal = app.durability.refusal();
      if (refusal !== null) throw durabilityUnsafe(refusal, { durability });
      return { status: 'ready', durability };
    },
  );
}
