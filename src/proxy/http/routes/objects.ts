// PUT/GET/DELETE /v1/objects/* — fenced object writes and reads; GET /v1/objects lists objects.
// Keys may hold `/` as it is (PUT /v1/objects/orders/7, as object stores allow) or percent-encoded
// (orders%2F7): the route is a wildcard, so both name the same object.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { type FencedOp, type FencedResult, NOT_FENCED, sqlState } from '../../../fence/index.ts';
import { ApiError } from '../../errors.ts';
import { IF_MATCH, IF_NONE_MATCH_READ, IF_NONE_MATCH_WRITE, etagHeader, notModified, writePrecondition } from '../conditional.ts';
import { admitWrite, fenceKeyFor, tokenHeader, writerId } from '../request.ts';
import { FENCED_HEADERS, KEY, NO_QUERY, keyParams } from '../validation.ts';
import { LIMIT, pageLimit } from './query.ts';
import { staleToken } from './stale.ts';

type KeyParams = { Params: { '*': string } };

// No body schema: an object body is raw bytes (any content type), stored as sent.
const params = keyParams('*');

/** `Fence-Key`: bytes of UTF-8 (request.ts decodes and checks it). */
const FENCE_KEY_HEADER = {
  type: 'string',
  description:
    "the fence key to check the token against (1 to 1024 bytes of UTF-8); default: the object key. Under a protected prefix (`fencepost protect --prefix`) the default is the prefix's fence key, and any other is refused (403 not_fenced)",
} as const;

const writeHeaders = (extra: Record<string, unknown>) =>
  ({
    ...FENCED_HEADERS,
    properties: {
      ...FENCED_HEADERS.properties,
      'fence-key': FENCE_KEY_HEADER,
      'if-match': IF_MATCH,
      'if-none-match': IF_NONE_MATCH_WRITE,
      ...extra,
    },
  }) as const;

const ETAG = {
  type: 'string',
  description: "the object's entity tag, quotes included: changes with every write, never repeats for a key",
} as const;

const putSchema = {
  summary: 'Write an object (fenced)',
  description:
    "Stores the raw body under the key if the token is at or above the fence (and, for a write naming another fence key, the object's own fence), in the same statement that raises the fence. `If-Match` and `If-None-Match: *` are checked in that statement too; a stale token gets 409 first.",
  params,
  querystring: NO_QUERY,
  headers: writeHeaders({
    'content-type': { type: 'string', description: 'stored with the object and returned by GET; default application/octet-stream' },
  }),
  response: {
    200: {
      description: 'written and committed; `version` counts writes to the key from 1',
      headers: { etag: ETAG },
      type: 'object',
      properties: {
        key: { type: 'string' },
        fenceKey: { type: 'string' },
        token: { type: 'string' },
        version: { type: 'integer' },
        etag: ETAG,
      },
    },
  },
};

/** What GET answers about the object, with its body (200) or without (304). */
const READ_HEADERS = {
  etag: ETAG,
  'object-version': { type: 'integer', description: "the object's version: writes to the key since it was created, from 1" },
  'fencing-token': { type: 'string', description: 'the token of the write that produced it' },
} as const;

const getSchema = {
  summary: 'Read an object',
  params,
  querystring: NO_QUERY,
  headers: { type: 'object', properties: { 'if-none-match': IF_NONE_MATCH_READ } },
  response: {
    200: {
      description:
        'the body as written, with its Content-Type; served sandboxed (`Content-Security-Policy: sandbox`, `X-Content-Type-Options: nosniff`)',
      headers: READ_HEADERS,
      content: { '*/*': { schema: { type: 'string', format: 'binary' } } },
    },
    304: { description: 'If-None-Match matched: the object is unchanged (no body)', headers: READ_HEADERS, type: 'null' },
  },
};

const deleteSchema = {
  summary: 'Delete an object (fenced)',
  description: 'A missing key with a valid token still advances the fence and answers 204 (unless `If-Match` asks for the object: 412).',
  params,
  querystring: NO_QUERY,
  headers: writeHeaders({}),
  response: { 204: { description: 'deleted (or there was nothing to delete) and committed', type: 'null' } },
};

const objectInfo = {
  type: 'object',
  properties: {
    key: { type: 'string' },
    fenceKey: { type: 'string' },
    token: { type: 'string' },
    version: { type: 'integer' },
    etag: ETAG,
    contentType: { type: 'string' },
    size: { type: 'integer', description: 'body bytes' },
    updatedAt: { type: 'string' },
  },
} as const;

/** `?prefix=`: empty (every key) or the start of a key. */
const PREFIX = {
  type: 'string',
  format: 'fencepost-key-prefix',
  description: 'empty, or the start of a key (at most 1024 bytes of UTF-8, no control characters)',
} as const;

const listSchema = {
  summary: 'List objects in key order',
  description: 'Keys in byte order (UTF-8), paged by key: pass `next` as `after`; `null` at the end. Nothing is counted.',
  querystring: { type: 'object', additionalProperties: false, properties: { prefix: PREFIX, after: KEY, limit: LIMIT } },
  response: { 200: { type: 'object', properties: { objects: { type: 'array', items: objectInfo }, next: { type: ['string', 'null'] } } } },
};

function contentTypeOf(req: FastifyRequest): string {
  const ct = req.headers['content-type'];
  return typeof ct === 'string' && ct !== '' ? ct : 'application/octet-stream';
}

function preconditionFailed(req: FastifyRequest, key: string): ApiError {
  req.log.debug({ key }, 'precondition failed');
  return new ApiError('precondition_failed', 'the object does not meet If-Match / If-None-Match: nothing written');
}

/**
 * Admits and applies a fenced write to `key` under the fence key fenceKeyFor resolves (Fence.write:
 * a fence held past the lock timeout is raised there, and the write goes once more). A write
 * Postgres refused as misfenced (FP403: the prefix was protected since the store last read the
 * list) rolled back whole: the list is read again at once and the write resolved again. A request
 * that named no Fence-Key then goes once more, under the prefix's fence key (admitted again: key
 * prefixes, forgery guard); one that named another gets 403 not_fenced.
 */
async function fencedObjectWrite(
  req: FastifyRequest,
  key: string,
  token: bigint,
  op: (fenceKey: string) => FencedOp,
): Promise<{ fenceKey: string; result: FencedResult }> {
  const fenceKey = fenceKeyFor(req, key);
  await admitWrite(req, fenceKey, token, key);
  try {
    return { fenceKey, result: await req.server.fence.write(op(fenceKey), { logger: req.log }) };
  } catch (err) {
    if (sqlState(err) !== NOT_FENCED) throw err;
    req.log.info({ key, fenceKey }, 'Postgres refused a misfenced object: reading the protected prefixes again');
    await req.server.fence.protectedPrefixes
      .refresh()
      .catch((e: unknown) => req.log.warn({ err: e }, 'reading the protected prefixes failed'));
    const resolved = fenceKeyFor(req, key); // 403 not_fenced when the request named another fence key
    if (resolved === fenceKey) throw err; // nothing new in the list: answered not_fenced with the trigger's message
    await admitWrite(req, resolved, token, key);
    return { fenceKey: resolved, result: await req.server.fence.write(op(resolved), { logger: req.log }) };
  }
}

export async function objectRoutes(app: FastifyInstance): Promise<void> {
  app.put<KeyParams>('/v1/objects/*', { config: { operation: 'put', access: 'write' }, schema: putSchema }, async (req, reply) => {
    const key = req.params['*'];
    const token = tokenHeader(req);
    const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    const { fenceKey, result } = await fencedObjectWrite(req, key, token, (fenceKey) => ({
      kind: 'put',
      key,
      fenceKey,
      token,
      contentType: contentTypeOf(req),
      body,
      writerId: writerId(req),
      ...writePrecondition(req),
    }));
    if (!result.accepted)
      throw result.preconditionFailed === true
        ? preconditionFailed(req, key)
        : staleToken(req, result.fenceKey ?? fenceKey, token, result.highestToken);
    const etag = etagHeader(result.etag ?? '');
    void reply.header('etag', etag);
    return { key, fenceKey, token: token.toString(), version: Number(result.version), etag };
  });

  app.get<KeyParams>('/v1/objects/*', { config: { access: 'read' }, schema: getSchema }, async (req, reply) => {
    const key = req.params['*'];
    const obj = await app.fence.object(key);
    if (!obj) throw new ApiError('not_found', 'no such object');
    // A body is the writer's, Content-Type included: opened in a browser it must not run as a page
    // of the proxy's origin (sandbox: an opaque origin, no scripts) nor be sniffed into one.
    void reply
      .header('x-content-type-options', 'nosniff')
      .header('content-security-policy', 'sandbox')
      .header('fencing-token', obj.token.toString())
      .header('object-version', obj.version.toString())
      .header('etag', etagHeader(obj.etag));
    if (notModified(req, obj.etag)) return reply.code(304).send();
    return reply.header('content-type', obj.contentType).send(obj.body);
  });

  app.delete<KeyParams>('/v1/objects/*', { config: { operation: 'delete', access: 'write' }, schema: deleteSchema }, async (req, reply) => {
    const key = req.params['*'];
    const token = tokenHeader(req);
    const { fenceKey, result } = await fencedObjectWrite(req, key, token, (fenceKey) => ({
      kind: 'delete',
      key,
      fenceKey,
      token,
      writerId: writerId(req),
      ...writePrecondition(req),
    }));
    if (!result.accepted)
      throw result.preconditionFailed === true
        ? preconditionFailed(req, key)
        : staleToken(req, result.fenceKey ?? fenceKey, token, result.highestToken);
    return reply.code(204).send();
  });

  app.get<{ Querystring: { prefix?: string; after?: string; limit?: string } }>(
    '/v1/objects',
    { config: { access: 'read' }, schema: listSchema },
    async (req) => {
      const page = await app.fence.objects(req.query.prefix ?? '', req.query.after ?? null, pageLimit(req.query.limit));
      return {
        objects: page.objects.map((o) => ({
          key: o.key,
          fenceKey: o.fenceKey,
          token: o.token.toString(),
          version: Number(o.version),
          etag: etagHeader(o.etag),
          contentType: o.contentType,
          size: o.size,
          updatedAt: o.updatedAt.toISOString(),
        })),
        next: page.next,
      };
    },
  );
}
