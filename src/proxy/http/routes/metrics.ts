// GET /metrics — Prometheus text exposition of this instance's metrics (src/proxy/metrics.ts).
import type { FastifyInstance } from 'fastify';

export async function metricsRoutes(app: FastifyInstance): Promise<void> {
  // 'read': open or behind a read key, as FENCEPOST_READ_ACCESS says (Prometheus sends bearer keys).
  app.get(
    '/metrics',
    { config: { access: 'read' }, schema: { summary: 'Prometheus metrics of this instance', produces: ['text/plain; version=0.0.4'] } },
    async (_req, reply) => {
      const text = await app.metrics.text();
      return reply.header('content-type', app.metrics.contentType).header('cache-control', 'no-store').send(text);
    },
  );
}
