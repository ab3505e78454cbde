// GET /v1/rejections (the rejection log, newest first, paged) and GET /v1/rejections/histogram
// (rejections per minute). Both read the database, so every proxy instance answers the same.
import type { FastifyInstance } from 'fastify';
import { KEY } from '../validation.ts';
import { LIMIT, pageLimit } from './query.ts';

export const MAX_HISTOGRAM_MINUTES = 1440;

/** `?before=`: a rejection id from a previous page's `next`. */
const BEFORE = {
  type: 'string',
  format: 'rejection-id',
  description: 'a rejection id: decimal digits from 1 to 9223372036854775807',
} as const;

/** `?minutes=`: 1…1440 in at most four digits, leading zeros allowed; default 60. */
const MINUTES = {
  type: 'string',
  pattern: '^(?:0{0,3}[1-9]|0{0,2}[1-9][0-9]|0?[1-9][0-9]{2}|1[0-3][0-9]{2}|14[0-3][0-9]|1440)$',
  description: `a whole number from 1 to ${MAX_HISTOGRAM_MINUTES}`,
} as const;

const rejectionSchema = {
  type: 'object',
  properties: {
    id: { type: 'string' },
    fenceKey: { type: 'string' },
    objectKey: { type: ['string', 'null'] },
    operation: { type: 'string' },
    door: {
      type: 'string',
      enum: ['http', 'transaction', 'sql'],
      description: 'where it was refused: HTTP object writes and fences, POST /v1/transactions, or the SQL endpoint',
    },
    token: { type: 'string' },
    highestToken: { type: 'string' },
    writerId: { type: ['string', 'null'] },
    rejectedAt: { type: 'string' },
  },
};

type Query = { Querystring: { limit?: string; before?: string; minutes?: string; fenceKey?: string } };

export async function rejectionRoutes(app: FastifyInstance): Promise<void> {
  app.get<Query>(
    '/v1/rejections',
    {
      config: { access: 'read' },
      schema: {
        summary: 'The rejection log, newest first, paged: pass `next` as `before`',
        querystring: { type: 'object', additionalProperties: false, properties: { limit: LIMIT, before: BEFORE, fenceKey: KEY } },
        response: {
          200: {
            type: 'object',
            properties: { rejections: { type: 'array', items: rejectionSchema }, next: { type: ['string', 'null'] } },
          },
        },
      },
    },
    async (req) => {
      const limit = pageLimit(req.query.limit);
      const before = req.query.before === undefined ? null : BigInt(req.query.before);
      const fenceKey = req.query.fenceKey ?? null;
      const page = await app.fence.rejectionsPage({ fenceKey, before, limit });
      return {
        rejections: page.rejections.map((r) => ({
          id: r.id.toString(),
          fenceKey: r.fenceKey,
          objectKey: r.objectKey,
          operation: r.operation,
          door: r.door,
          token: r.token.toString(),
          highestToken: r.highestToken.toString(),
          writerId: r.writerId,
          rejectedAt: r.rejectedAt.toISOString(),
        })),
        next: page.next === null ? null : page.next.toString(),
      };
    },
  );

  app.get<Query>(
    '/v1/rejections/histogram',
    {
      config: { access: 'read' },
      schema: {
        summary: 'Rejections per minute over the last `minutes`, oldest first, empty minutes as 0',
        querystring: { type: 'object', additionalProperties: false, properties: { minutes: MINUTES, fenceKey: KEY } },
        response: {
          200: {
            type: 'object',
            properties: {
              bucketSeconds: { type: 'integer' },
              fenceKey: { type: ['string', 'null'] },
              buckets: { type: 'array', items: { type: 'object', properties: { start: { type: 'string' }, count: { type: 'integer' } } } },
            },
          },
        },
      },
    },
    async (req) => {
      const minutes = req.query.minutes === undefined ? 60 : Number(req.query.minutes);
      const fenceKey = req.query.fenceKey ?? null;
      const buckets = await app.fence.rejectionHistogram(minutes, fenceKey);
      return { bucketSeconds: 60, fenceKey, buckets: buckets.map((b) => ({ start: b.start.toISOString(), count: b.count })) };
    },
  );
}
