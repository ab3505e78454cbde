// GET / (where to look), GET /openapi.json (the OpenAPI document, src/proxy/http/openapi.ts) and GET
// /docs (the reference page, src/proxy/api-reference.ts). All 'open': they describe the API and
// hold no data. The document is built once, at the first request, from the routes registered.
import type { FastifyInstance, FastifyReply } from 'fastify';
import { REFERENCE_CSP, renderReference } from '../api-reference.ts';

const INDEX_CSP = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const LINKS = { docs: '/docs', openapi: '/openapi.json', dashboard: '/dashboard', metrics: '/metrics', health: '/healthz' };

function html(reply: FastifyReply, csp: string, body: string): FastifyReply {
  return reply
    .header('content-type', 'text/html; charset=utf-8')
    .header('content-security-policy', csp)
    .header('x-content-type-options', 'nosniff')
    .send(body);
}

export async function docsRoutes(app: FastifyInstance): Promise<void> {
  let page: string | null = null;

  app.get(
    '/',
    {
      config: { access: 'open' },
      schema: {
        summary: 'Where to look: the reference, the OpenAPI document, the live dashboard',
        description: 'HTML for browsers (`Accept: text/html`), else JSON with the same links.',
        produces: ['application/json', 'text/html'],
      },
    },
    async (req, reply) => {
      const accept = req.headers.accept;
      if (typeof accept === 'string' && accept.includes('text/html')) {
        const items = Object.entries(LINKS)
          .map(([name, href]) => `<li><a href="${href}">${href}</a> ${name}</li>`)
          .join('');
        return html(
          reply,
          INDEX_CSP,
          `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>fencepost</title></head><body><h1>fencepost</h1><ul>${items}</ul></body></html>\n`,
        );
      }
      return { name: 'fencepost', ...LINKS };
    },
  );

  app.get(
    '/openapi.json',
    { config: { access: 'open' }, schema: { summary: 'The OpenAPI 3.1 document of this API' } },
    async (_req, reply) => reply.header('cache-control', 'no-cache').send(app.swagger()),
  );

  app.get(
    '/docs',
    { config: { access: 'open' }, schema: { summary: 'The API reference page (no scripts, works offline)', produces: ['text/html'] } },
    async (_req, reply) => {
      page ??= renderReference(app.swagger() as unknown as Record<string, unknown>);
      return html(reply.header('cache-control', 'no-cache'), REFERENCE_CSP, page);
    },
  );
}
