// GET /dashboard — the live ops page: static files from src/proxy/http/dashboard/, read once at start-up.
// The page polls /v1/stats, /v1/rejections and /v1/rejections/histogram (database numbers, the
// same from every instance). No build step; nothing is loaded from outside this proxy (the CSP
// below enforces it). The files themselves are 'open': they hold no data. The endpoints they call
// are 'read'; when those need a key, the page asks for one and sends it as a bearer token.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';

const DIR = join(import.meta.dirname, '..', 'dashboard');

const CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const FILES = [
  { url: '/dashboard', file: 'index.html', type: 'text/html; charset=utf-8' },
  { url: '/dashboard/dashboard.js', file: 'dashboard.js', type: 'text/javascript; charset=utf-8' },
  { url: '/dashboard/dashboard.css', file: 'dashboard.css', type: 'text/css; charset=utf-8' },
];

export async function dashboardRoutes(app: FastifyInstance): Promise<void> {
  for (const { url, file, type } of FILES) {
    const body = readFileSync(join(DIR, file));
    app.get(
      url,
      {
        config: { access: 'open' },
        schema: {
          summary: file === 'index.html' ? 'The live ops page (polls the JSON endpoints)' : `The live page's ${file}`,
          produces: [type.split(';')[0]!],
        },
      },
      async (_req, reply) =>
        reply
          .header('content-type', type)
          .header('cache-control', 'no-cache')
          .header('content-security-policy', CSP)
          .header('x-content-type-options', 'nosniff')
          .send(body),
    );
  }
}
