// Writer authentication on the HTTP door: `Authorization: Bearer <key>` (keys: access/keys.ts).
// Each route declares `config: { access: 'open' | 'read' | 'write' }`; the onRequest hook enforces
// it before the body is read.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { findKey, withinPrefixes, type AccessKey, type AuthConfig } from '../access/keys.ts';
import { ApiError } from '../errors.ts';
import type { RouteAccess } from './route-config.ts';

export type { AccessKey, AuthConfig };

declare module 'fastify' {
  interface FastifyRequest {
    /** The authenticated key; null when the proxy runs open or the route is open. */
    accessKey: AccessKey | null;
  }
}

/** Default for routes that declare nothing: reads for GET/HEAD, writes for everything else. */
function accessOf(req: FastifyRequest): RouteAccess {
  return req.routeOptions.config?.access ?? (req.method === 'GET' || req.method === 'HEAD' ? 'read' : 'write');
}

/** Registers the onRequest hook that enforces each route's `access`. */
export function registerAuth(app: FastifyInstance, auth: AuthConfig): void {
  app.decorateRequest('accessKey', null);
  if (auth.keys.length === 0) return;
  app.addHook('onRequest', async (req) => {
    const access = accessOf(req);
    if (access === 'open') return;
    const key = findKey(auth.keys, req.headers.authorization);
    if (access === 'read' && auth.readAccess === 'open') {
      req.accessKey = key;
      return;
    }
    if (key === null) {
      throw new ApiError(
        'unauthorized',
        req.headers.authorization === undefined
          ? 'this request needs Authorization: Bearer <key>'
          : 'the bearer key matches no configured key',
      );
    }
    if (access === 'write' && key.readOnly) {
      req.log.warn({ keyName: key.name, method: req.method, url: req.url.split('?')[0] }, 'read-only key refused a write');
      throw new ApiError('forbidden', `key ${key.name} is read-only`);
    }
    req.accessKey = key;
  });
}

/** Refuses (403) when the request's key may not write under every one of `keys`. Open mode allows all. */
export function authorizeKeys(req: FastifyRequest, keys: readonly string[]): void {
  const k = req.accessKey;
  if (k === null) return;
  for (const key of keys) {
    if (!withinPrefixes(k.fenceKeyPrefixes, key)) {
      req.log.warn({ keyName: k.name }, 'key outside its prefixes refused');
      throw new ApiError('forbidden', `key ${k.name} may not write ${JSON.stringify(key)}: it is outside its fence-key prefixes`);
    }
  }
}
