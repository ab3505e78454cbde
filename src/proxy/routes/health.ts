// GET /healthz (the process answers) and GET /readyz (database reachable, migrations applied).
import type { FastifyInstance } from 'fastify';
import { migrationsApplied } from '../../fence/migrate.ts';
import { ApiError } from '../errors.ts';

export async function healthRoutes(app: FastifyInstance): Promise<void> {
  app.get('/healthz', { config: { access: 'open' } }, async () => ({ status: 'ok' }));
  app.get('/readyz', { config: { access: 'open' } }, async () => {
    let ready: boolean;
    try {
      ready = await migrationsApplied(app.store.pool);
    } catch (err) {
      throw new ApiError('unavailable', 'database unreachable', {}, { cause: err });
    }
    if (!ready) throw new ApiError('unavailable', 'migrations not applied');
    return { status: 'ready' };
  });
}
