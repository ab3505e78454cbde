// GET /v1/stats — accepted and rejected write counts from the database, so every proxy instance
// gives the same answer.
import type { FastifyInstance } from 'fastify';
import { LIMIT, pageLimit } from './query.ts';

const countSchema = {
  type: 'object',
  properties: {
    fenceKey: { type: 'string' },
    highestToken: { type: 'string' },
    raisedBy: {
      type: ['string', 'null'],
      description: 'Writer-Id of the write that raised the fence to highestToken; null if it sent none',
    },
    raisedAt: {
      type: 'string',
      format: 'date-time',
      description: 'when the fence was raised to highestToken: since when its holder leads',
    },
    accepted: { type: 'integer' },
    rejected: { type: 'integer' },
  },
};

export async function statsRoutes(app: FastifyInstance): Promise<void> {
  app.get<{ Querystring: { limit?: string } }>(
    '/v1/stats',
    {
      config: { access: 'read' },
      schema: {
        summary: 'Accepted and rejected counts, overall and per fence key (most recently rejected first), from the database',
        querystring: { type: 'object', additionalProperties: false, properties: { limit: LIMIT } },
        response: {
          200: {
            type: 'object',
            properties: {
              accepted: { type: 'integer' },
              rejected: { type: 'integer' },
              fenceCount: { type: 'integer' },
              unflushedAccepted: {
                type: 'integer',
                description:
                  'SQL-door transactions this proxy saw commit that `accepted` lacks yet: 0 unless its flush to the database failed (it is retried every 2 s)',
              },
              byFenceKey: { type: 'array', items: countSchema },
            },
          },
        },
      },
    },
    async (req) => {
      const limit = pageLimit(req.query.limit);
      const s = await app.fence.stats(limit);
      return {
        accepted: Number(s.accepted),
        rejected: Number(s.rejected),
        fenceCount: s.fences,
        unflushedAccepted: s.unflushed,
        byFenceKey: s.perFence.map((f) => ({
          fenceKey: f.fenceKey,
          highestToken: f.highestToken.toString(),
          raisedBy: f.raisedBy,
          raisedAt: f.raisedAt.toISOString(),
          accepted: Number(f.accepted),
          rejected: Number(f.rejected),
        })),
      };
    },
  );
}
