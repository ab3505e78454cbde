// PUT/GET/DELETE /v1/objects/:key — fenced object writes and reads.
import { createHash } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../errors.ts';
import { admitWrite, checkKey, fenceKeyFor, requireToken, writerId } from '../request.ts';
import { staleToken } from './stale.ts';

type KeyParams = { Params: { key: string } };

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
  app.put<KeyParams>('/v1/objects/:key', { config: { operation: 'put', access: 'write' }, schema: { response: putResponse } }, async (req) => {
    const key = checkKey(req.params.key, 'key');
    const fenceKey = fenceKeyFor(req, key);
    const token = requireToken(req);
    await admitWrite(req, fenceKey, token, key);
    const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    const result = await app.store.write({ kind: 'put', key, fenceKey, token, contentType: contentTypeOf(req), body, writerId: writerId(req) });
    if (!result.accepted) throw staleToken(req, result.fenceKey ?? fenceKey, token, result.highestToken);
    return { key, fenceKey, token: token.toString(), version: Number(result.version) };
  });

  app.get<KeyParams>('/v1/objects/:key', { config: { access: 'read' } }, async (req, reply) => {
    const key = checkKey(req.params.key, 'key');
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

  app.delete<KeyParams>('/v1/objects/:key', { config: { operation: 'delete', access: 'write' } }, async (req, reply) => {
    const key = checkKey(req.params.key, 'key');
    const fenceKey = fenceKeyFor(req, key);
    const token = requireToken(req);
    await admitWrite(req, fenceKey, token, key);
    const result = await app.store.write({ kind: 'delete', key, fenceKey, token, writerId: writerId(req) });
    if (!result.accepted) throw staleToken(req, result.fenceKey ?? fenceKey, token, result.highestToken);
    return reply.code(204).send();
  });

  // find-my-way does not match an empty parameter.
  app.route({
    method: ['GET', 'PUT', 'DELETE'],
    url: '/v1/objects/',
    handler: async () => {
      throw new ApiError('invalid_key', 'key is empty');
    },
  });
}
