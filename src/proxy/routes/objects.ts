// PUT/GET/DELETE /v1/objects/:key — fenced object writes and reads.
import { createHash } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../errors.ts';
import { admitWrite, fenceKeyFor, tokenHeader, writerId } from '../request.ts';
import { FENCED_HEADERS, NO_QUERY, keyParams } from '../validation.ts';
import { staleToken } from './stale.ts';

type KeyParams = { Params: { key: string } };

// No body schema: an object body is raw bytes (any content type), stored as sent.
const params = keyParams('key');

const putResponse = {
  200: {
    type: 'object',
    properties: { key: { type: 'string' }, fenceKey: { type: 'string' }, token: { type: 'string' }, version: { type: 'integer' } },
  },
};

function contentTypeOf(req: FastifyRequest): string {
  const ct = req.headers['content-type'];
  return typeof ct === 'string' && ct !== '' ? ct : 'application/octet-stream';
}

export async function objectRoutes(app: FastifyInstance): Promise<void> {
  app.put<KeyParams>('/v1/objects/:key', { config: { operation: 'put', access: 'write' }, schema: { params, querystring: NO_QUERY, headers: FENCED_HEADERS, response: putResponse } }, async (req) => {
    const key = req.params.key;
    const fenceKey = fenceKeyFor(req, key);
    const token = tokenHeader(req);
    await admitWrite(req, fenceKey, token, key);
    const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    const result = await app.store.write({ kind: 'put', key, fenceKey, token, contentType: contentTypeOf(req), body, writerId: writerId(req) });
    if (!result.accepted) throw staleToken(req, result.fenceKey ?? fenceKey, token, result.highestToken);
    return { key, fenceKey, token: token.toString(), version: Number(result.version) };
  });

  app.get<KeyParams>('/v1/objects/:key', { config: { access: 'read' }, schema: { params, querystring: NO_QUERY } }, async (req, reply) => {
    const key = req.params.key;
    const obj = await app.store.readObject(key);
    if (!obj) throw new ApiError('not_found', 'no such object');
    const etag = createHash('sha256').update(obj.body).digest('base64url').slice(0, 27);
    // A body is the writer's, Content-Type included: opened in a browser it must not run as a page
    // of the proxy's origin (sandbox: an opaque origin, no scripts) nor be sniffed into one.
    return reply
      .header('content-type', obj.contentType)
      .header('x-content-type-options', 'nosniff')
      .header('content-security-policy', 'sandbox')
      .header('fencing-token', obj.token.toString())
      .header('etag', `"${etag}"`)
      .send(obj.body);
  });

  app.delete<KeyParams>('/v1/objects/:key', { config: { operation: 'delete', access: 'write' }, schema: { params, querystring: NO_QUERY, headers: FENCED_HEADERS } }, async (req, reply) => {
    const key = req.params.key;
    const fenceKey = fenceKeyFor(req, key);
    const token = tokenHeader(req);
    await admitWrite(req, fenceKey, token, key);
    const result = await app.store.write({ kind: 'delete', key, fenceKey, token, writerId: writerId(req) });
    if (!result.accepted) throw staleToken(req, result.fenceKey ?? fenceKey, token, result.highestToken);
    return reply.code(204).send();
  });

  // find-my-way does not match an empty parameter.
  app.route({
    method: ['GET', 'PUT', 'DELETE'],
    url: '/v1/objects/',
    schema: { querystring: NO_QUERY },
    handler: async () => {
      throw new ApiError('invalid_key', 'key is empty');
    },
  });
}
