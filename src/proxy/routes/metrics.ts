// GET /metrics — Prometheus text exposition of this instance's metrics (src/proxy/metrics.ts).
import type { FastifyInstance } from 'fastify';

export async function metricsRoutes(app: FastifyInstance): Promise<void> {
  // 'open' like /healthz: scrapers need it, and it holds no keys, tokens or bodies.
  app.get('/metrics', { config: { access: 'open' } }, async (_req, reply) => {
    const text = await app.metrics.text();
    return reply.header('content-type', app.metrics.contentType).header('cache-control', 'no-store').send(text);
  });
}
