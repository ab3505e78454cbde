// Pages cannot drive the proxy. A browser sends requests for whatever page it shows: a form post
// (text/plain, urlencoded or multipart, no preflight), a cross-origin fetch, or, after DNS
// rebinding, "same-origin" requests to the attacker's own name now resolving to the proxy. So:
// - POST bodies must be `application/json` (415 unsupported_media_type): a form cannot send that,
//   and a page's fetch that does needs a CORS preflight, which the proxy never grants. Every POST
//   route of this API takes JSON; object bodies (PUT) are raw, but a form cannot PUT.
// - A request whose `Origin` is neither listed (allowedOrigins, exact) nor the proxy's own (Origin's
//   host:port = the Host header, so the built-in /dashboard works) is refused: 403 forbidden_origin.
//   `Origin: null` (sandboxed pages, such as objects served back: see routes/objects.ts) is foreign.
// - Open mode only (no keys): `Host` must be an IP literal, `localhost` or a listed name (403
//   forbidden_host). A rebinding page reaches the proxy only under its own DNS name, which the
//   browser puts in Host. With keys, bearer keys protect (a page cannot know one).
// The checks run on every route, before authentication and before the body is read.
import { isIP } from 'node:net';
import type { FastifyInstance, FastifyRequest, onRequestHookHandler } from 'fastify';
import { ApiError } from '../errors.ts';

export interface BrowserConfig {
  /** Origins (`scheme://host[:port]`, as browsers send them) whose pages may call the proxy. */
  allowedOrigins: readonly string[];
  /** Host names (lower case, no port) an open-mode proxy answers to, besides IP literals and localhost. */
  allowedHosts: readonly string[];
}

const JSON_TYPE = /^\s*application\/json\s*(;|$)/i;
const HOST_NAME = /^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$/;

/** Checks one FENCEPOST_ALLOWED_ORIGINS entry; throws Error naming the problem. */
export function parseOrigin(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new Error(`${JSON.stringify(raw)} is not an origin (scheme://host[:port])`);
  }
  if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.origin !== raw) {
    throw new Error(
      `${JSON.stringify(raw)} is not an origin as browsers send it: write ${url.protocol === 'http:' || url.protocol === 'https:' ? url.origin : 'http(s)://host[:port]'} (lower case, no path, no trailing slash, no default port)`,
    );
  }
  return raw;
}

/** Checks one FENCEPOST_ALLOWED_HOSTS entry (a DNS name, no port); returns it in lower case. */
export function parseHostName(raw: string): string {
  const name = raw.toLowerCase();
  if (!HOST_NAME.test(name) || isIP(name) !== 0)
    throw new Error(`${JSON.stringify(raw)} is not a host name (no port, no scheme; IP addresses are always allowed)`);
  return name;
}

/** The host name of a Host header value (`name:port`, `1.2.3.4:port`, `[::1]:port`), lower case. */
function hostNameOf(host: string): string {
  const h = host.trim().toLowerCase();
  if (h.startsWith('[')) {
    const end = h.indexOf(']');
    return end < 0 ? h : h.slice(1, end);
  }
  return h.replace(/:\d*$/, '');
}

/** Origin's host:port equals the Host header's (default ports dropped, under Origin's scheme). */
function sameOrigin(origin: string, host: string | undefined): boolean {
  if (host === undefined || host === '') return false;
  try {
    const o = new URL(origin);
    if (o.protocol !== 'http:' && o.protocol !== 'https:') return false;
    return o.host === new URL(`${o.protocol}//${host}`).host;
  } catch {
    return false; // `null`, or not a URL at all
  }
}

const jsonOnly: onRequestHookHandler = async (req) => {
  const type = req.headers['content-type'];
  if (typeof type !== 'string' || !JSON_TYPE.test(type)) {
    throw new ApiError(
      'unsupported_media_type',
      `this route takes Content-Type: application/json${typeof type === 'string' ? `, not ${JSON.stringify(type.slice(0, 100))}` : ''}`,
    );
  }
};

/**
 * Registers the checks. Call before any route is registered (the JSON check is attached to each
 * POST route as it is added) and before authentication (its hook runs first).
 */
export function registerBrowserGuard(app: FastifyInstance, config: BrowserConfig, mode: { open: boolean }): void {
  const origins = new Set(config.allowedOrigins);
  const hosts = new Set(config.allowedHosts);
  app.addHook('onRoute', (route) => {
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    if (!methods.includes('POST')) return;
    const own = route.onRequest;
    route.onRequest = own === undefined ? [jsonOnly] : [jsonOnly, ...(Array.isArray(own) ? own : [own])];
  });
  app.addHook('onRequest', async (req: FastifyRequest) => {
    const origin = req.headers.origin;
    if (origin !== undefined && !origins.has(origin) && !sameOrigin(origin, req.headers.host)) {
      req.log.warn(
        { origin: origin.slice(0, 200), method: req.method, url: req.url.split('?')[0] },
        'request from a foreign origin refused',
      );
      throw new ApiError(
        'forbidden_origin',
        `requests from origin ${JSON.stringify(origin.slice(0, 200))} are not allowed (FENCEPOST_ALLOWED_ORIGINS)`,
      );
    }
    // No Host at all (HTTP/1.0) names no DNS name, so nothing can have rebound it.
    const host = req.headers.host;
    if (mode.open && host !== undefined) {
      const name = hostNameOf(host);
      if (isIP(name) === 0 && name !== 'localhost' && !hosts.has(name)) {
        req.log.warn(
          { host: host.slice(0, 200), method: req.method, url: req.url.split('?')[0] },
          'request for a foreign host name refused',
        );
        throw new ApiError(
          'forbidden_host',
          `host name ${JSON.stringify(name.slice(0, 200))} is not allowed: without keys the proxy answers only to IP addresses, localhost and FENCEPOST_ALLOWED_HOSTS`,
        );
      }
    }
  });
}
