// GET /healthz (the process answers) and GET /readyz (database reachable, migrations applied, the
// database takes writes; with `durability`, the durability monitor's latest report: failover
// warnings, which make it unready only while writes are refused for them, FENCEPOST_REQUIRE_SYNC_STANDBY).
import type { FastifyInstance } from 'fastify';
import { migrationsApplied, writability, NoWritableHostError } from '../../../fence/index.ts';
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
      let ready: boolean;
      try {
        ready = await migrationsApplied(app.store.pool);
      } catch (err) {
        // Several hosts in DATABASE_URL: the reason names each and why it does not fit.
        throw new ApiError(
          'unavailable',
          err instanceof NoWritableHostError ? `database unreachable: ${err.message}` : 'database unreachable',
          {},
          { cause: err },
        );
      }
      if (!ready) throw new ApiError('unavailable', 'migrations not applied');
      // A standby (or a primary set read-only) answers reads and refuses every write: not ready.
      const mode = await app.store.pool.query<{ recovery: boolean; read_only: string }>(writability()).catch((err: unknown) => {
        throw new ApiError('unavailable', 'database unreachable', {}, { cause: err });
      });
      const m = mode.rows[0];
      if (m?.recovery) throw new ApiError('unavailable', 'the database is in recovery (a standby): it takes no writes');
      if (m?.read_only === 'on')
        throw new ApiError('unavailable', 'the database is read-only (default_transaction_read_only): it takes no writes');
      // The monitor's latest report (a check of its own only when no timer runs: buildApp without one).
      const durability = await app.durability.report();
      const refusal = app.durability.refusal();
      if (refusal !== null) throw durabilityUnsafe(refusal, { durability });
      return { status: 'ready', durability };
    },
  );
}
