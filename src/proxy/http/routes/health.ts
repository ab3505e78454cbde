// GET /healthz (the process answers) and GET /readyz (database reachable, migrations applied; with
// `durability`, the failover warnings of src/fence/durability.ts, which do not make it unready).
import type { FastifyInstance } from 'fastify';
import { migrationsApplied } from '../../../fence/migrate.ts';
import { checkDurability, unknownDurability } from '../../../fence/durability.ts';
import { ApiError } from '../../errors.ts';
import { writability } from '../../../fence/queries.ts';
import { NoWritableHostError } from '../../../fence/primary-finder.ts';

export async function healthRoutes(app: FastifyInstance): Promise<void> {
  app.get('/healthz', { config: { access: 'open' }, schema: { summary: 'Liveness: the process answers' } }, async () => ({ status: 'ok' }));
  app.get('/readyz', { config: { access: 'open' }, schema: { summary: 'Readiness: database reachable, migrations applied; `durability` lists failover warnings (which do not make it unready)' } }, async (req) => {
    let ready: boolean;
    try {
      ready = await migrationsApplied(app.store.pool);
    } catch (err) {
      // Several hosts in DATABASE_URL: the reason names each and why it does not fit.
      throw new ApiError('unavailable', err instanceof NoWritableHostError ? `database unreachable: ${err.message}` : 'database unreachable', {}, { cause: err });
    }
    if (!ready) throw new ApiError('unavailable', 'migrations not applied');
    // A standby (or a primary set read-only) answers reads and refuses every write: not ready.
    const mode = await app.store.pool.query<{ recovery: boolean; read_only: string }>(writability()).catch((err: unknown) => {
      throw new ApiError('unavailable', 'database unreachable', {}, { cause: err });
    });
    const m = mode.rows[0];
    if (m?.recovery) throw new ApiError('unavailable', 'the database is in recovery (a standby): it takes no writes');
    if (m?.read_only === 'on') throw new ApiError('unavailable', 'the database is read-only (default_transaction_read_only): it takes no writes');
    const durability = await checkDurability(app.store.pool).catch((err: unknown) => {
      req.log.warn({ err }, 'durability check failed');
      return unknownDurability();
    });
    return { status: 'ready', durability };
  });
}
