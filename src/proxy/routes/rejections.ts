// GET /v1/rejections (the rejection log, newest first, paged) and GET /v1/rejections/histogram
// (rejections per minute). Both read the database, so every proxy instance answers the same.
import type { FastifyInstance } from 'fastify';
import { readRejectionHistogram, readRejections } from '../../fence/rejections.ts';
import { ApiError } from '../errors.ts';
import { checkKey } from '../request.ts';
import { parseLimit } from './query.ts';

const MAX_ID = 9223372036854775807n;
export const MAX_HISTOGRAM_MINUTES = 1440;

/** `?before=`: a rejection id (decimal digits, 1…2^63−1) from a previous page's `next`. */
function parseBefore(raw: unknown): bigint | null {
  if (raw === undefined) return null;
  if (typeof raw !== 'string' || !/^\d{1,19}$/.test(raw) || BigInt(raw) < 1n || BigInt(raw) > MAX_ID) {
    throw new ApiError('invalid_query', 'before must be a rejection id: decimal digits from 1 to 9223372036854775807');
  }
  return BigInt(raw);
}

/** `?minutes=`: 1…1440, default 60. */
function parseMinutes(raw: unknown): number {
  if (raw === undefined) return 60;
  if (typeof raw !== 'string' || !/^\d{1,4}$/.test(raw) || Number(raw) < 1 || Number(raw) > MAX_HISTOGRAM_MINUTES) {
    throw new ApiError('invalid_query', `minutes must be a whole number from 1 to ${MAX_HISTOGRAM_MINUTES}`);
  }
  return Number(raw);
}

function parseFenceKey(raw: unknown): string | null {
  if (raw === undefined) return null;
  if (typeof raw !== 'string') throw new ApiError('invalid_query', 'fenceKey must be given once');
  return checkKey(raw, 'fence key');
}

const rejectionSchema = {
  type: 'object',
  properties: {
    id: { type: 'string' },
    fenceKey: { type: 'string' },
    objectKey: { type: ['string', 'null'] },
    operation: { type: 'string' },
    token: { type: 'string' },
    highestToken: { type: 'string' },
    writerId: { type: ['string', 'null'] },
    rejectedAt: { type: 'string' },
  },
};

type Query = { Querystring: Record<string, unknown> };

export async function rejectionRoutes(app: FastifyInstance): Promise<void> {
  app.get<Query>(
    '/v1/rejections',
    {
      config: { access: 'read' },
      schema: { response: { 200: { type: 'object', properties: { rejections: { type: 'array', items: rejectionSchema }, next: { type: ['string', 'null'] } } } } },
    },
    async (req) => {
      const limit = parseLimit(req.query.limit, 100);
      const before = parseBefore(req.query.before);
      const fenceKey = parseFenceKey(req.query.fenceKey);
      const page = await readRejections(app.store.pool, { fenceKey, before, limit });
      return {
        rejections: page.rejections.map((r) => ({
          id: r.id.toString(),
          fenceKey: r.fenceKey,
          objectKey: r.objectKey,
          operation: r.operation,
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
      const minutes = parseMinutes(req.query.minutes);
      const fenceKey = parseFenceKey(req.query.fenceKey);
      const buckets = await readRejectionHistogram(app.store.pool, minutes, fenceKey);
      return { bucketSeconds: 60, fenceKey, buckets: buckets.map((b) => ({ start: b.start.toISOString(), count: b.count })) };
    },
  );
}
