// PUT/GET /v1/fences/:fenceKey and GET /v1/fences — advance and inspect fences.
import type { FastifyInstance } from 'fastify';
import type { FenceRecord } from '../../../fence/index.ts';
import { ApiError } from '../../errors.ts';
import { admitWrite, tokenHeader, writerId } from '../request.ts';
import { FENCED_HEADERS, KEY, NO_QUERY, keyParams } from '../validation.ts';
import { LIMIT, pageLimit } from './query.ts';
import { staleToken } from './stale.ts';

type FenceParams = { Params: { fenceKey: string } };

const fenceSchema = {
  type: 'object',
  properties: {
    fenceKey: { type: 'string' },
    highestToken: { type: 'string' },
    updatedAt: { type: 'string' },
    raisedBy: {
      type: ['string', 'null'],
      description: 'Writer-Id of the write that raised the fence to highestToken; null if it sent none',
    },
    accepted: { type: 'integer' },
    rejected: { type: 'integer' },
  },
};

function fenceJson(f: FenceRecord) {
  return {
    fenceKey: f.fenceKey,
    highestToken: f.highestToken.toString(),
    updatedAt: f.updatedAt.toISOString(),
    raisedBy: f.raisedBy,
    accepted: Number(f.accepted),
    rejected: Number(f.rejected),
  };
}

export async function fenceRoutes(app: FastifyInstance): Promise<void> {
  app.put<FenceParams>(
    '/v1/fences/:fenceKey',
    {
      config: { operation: 'fence', access: 'write' },
      schema: {
        summary: 'Advance a fence without writing data (fenced)',
        params: keyParams('fenceKey'),
        querystring: NO_QUERY,
        headers: FENCED_HEADERS,
        response: { 200: { type: 'object', properties: { fenceKey: { type: 'string' }, highestToken: { type: 'string' } } } },
      },
    },
    async (req) => {
      const fenceKey = req.params.fenceKey;
      const token = tokenHeader(req);
      await admitWrite(req, fenceKey, token);
      const result = await app.fence.advance(fenceKey, token, writerId(req), { logger: req.log });
      if (!result.accepted) throw staleToken(req, fenceKey, token, result.highestToken);
      return { fenceKey, highestToken: result.highestToken.toString() };
    },
  );

  app.get<FenceParams>(
    '/v1/fences/:fenceKey',
    {
      config: { access: 'read' },
      schema: {
        summary: 'Read a fence: its highest token and counts; 404 if never seen',
        params: keyParams('fenceKey'),
        querystring: NO_QUERY,
        response: { 200: fenceSchema },
      },
    },
    async (req) => {
      const fenceKey = req.params.fenceKey;
      const fence = await app.fence.fence(fenceKey);
      if (!fence) throw new ApiError('not_found', 'no write has used this fence key');
      return fenceJson(fence);
    },
  );

  app.get<{ Querystring: { after?: string; limit?: string } }>(
    '/v1/fences',
    {
      config: { access: 'read' },
      schema: {
        summary: 'List fences in key order (byte order), paged: pass `next` as `after`',
        querystring: { type: 'object', additionalProperties: false, properties: { limit: LIMIT, after: KEY } },
        response: {
          200: { type: 'object', properties: { fences: { type: 'array', items: fenceSchema }, next: { type: ['string', 'null'] } } },
        },
      },
    },
    async (req) => {
      const limit = pageLimit(req.query.limit);
      const after = req.query.after ?? null;
      const page = await app.fence.fences(after, limit);
      return { fences: page.fences.map(fenceJson), next: page.next };
    },
  );

  app.route({
    method: ['GET', 'PUT'],
    url: '/v1/fences/',
    schema: { querystring: NO_QUERY },
    handler: async () => {
      throw new ApiError('invalid_key', 'fence key is empty');
    },
  });
}
