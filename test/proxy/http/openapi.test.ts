// GET /openapi.json (generated from the routes' own schemas), GET /docs (the reference page, no
// scripts, nothing from elsewhere) and GET / (where to look).
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { FastifyInstance, RouteOptions } from 'fastify';
import { Validator } from '@seriousme/openapi-schema-validator';
import type { Browser } from 'playwright-core';
import { ERRORS, type ErrorCode } from '../../../src/proxy/errors.ts';
import { TOKEN } from '../../../src/proxy/http/validation.ts';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { listen, testApp } from '../../support/proxy.ts';
import { launchChromium } from '../../../tools/chromium.ts';
import { SECRET, bearer, securedApp, uniqueRole } from '../../support/keys.ts';

let db: TestDatabase;
let app: FastifyInstance;
const routes: RouteOptions[] = [];

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
let doc: Json;

beforeAll(async () => {
  db = await createTestDatabase();
  app = testApp(db.pool);
  app.addHook('onRoute', (route) => {
    routes.push(route);
  });
  await app.ready();
  const res = await app.inject({ url: '/openapi.json' });
  expect(res.statusCode).toBe(200);
  expect(res.headers['content-type']).toMatch(/^application\/json/);
  doc = res.json() as Json;
});
afterAll(async () => {
  await app.close();
  await db.drop();
});

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'head', 'options'];

/** Every operation of the document, as `METHOD path` → operation. */
function operations(d: Json): Map<string, Json> {
  const out = new Map<string, Json>();
  for (const [path, item] of Object.entries(d.paths as Json))
    for (const m of METHODS) if ((item as Json)[m]) out.set(`${m.toUpperCase()} ${path}`, (item as Json)[m] as Json);
  return out;
}

/** fastify's route pattern as an OpenAPI path: `:name` → `{name}`, the object key wildcard → `{key}`. */
const openapiPath = (url: string) => url.replace(/:([A-Za-z]+)/g, '{$1}').replace(/\/\*$/, '/{key}');

describe('GET /openapi.json', () => {
  test('is a valid OpenAPI 3.1 document (checked by @seriousme/openapi-schema-validator)', async () => {
    expect(doc.openapi).toBe('3.1.0');
    const result = await new Validator().validate(structuredClone(doc));
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
  });

  test('documents every route and method fastify serves', () => {
    const ops = operations(doc);
    const missing: string[] = [];
    for (const r of routes) {
      // `/v1/fences/`: an empty key, answered invalid_key (documented under the key's route).
      if (r.url.length > 1 && r.url.endsWith('/')) continue;
      for (const m of Array.isArray(r.method) ? r.method : [r.method]) {
        if (m === 'HEAD') continue; // fastify's automatic HEAD of each GET
        if (!ops.has(`${m} ${openapiPath(r.url)}`)) missing.push(`${m} ${r.url}`);
      }
    }
    expect(missing).toEqual([]);
    for (const op of [
      'PUT /v1/objects/{key}',
      'GET /v1/objects',
      'GET /v1/objects/{key}',
      'DELETE /v1/objects/{key}',
      'POST /v1/transactions',
      'GET /docs',
      'GET /openapi.json',
      'GET /',
    ]) {
      expect([...ops.keys()]).toContain(op);
    }
  });

  test("documents every registry error code, each under its status with a body of the registry's shape", () => {
    const seen = new Set<string>();
    for (const [name, op] of operations(doc)) {
      for (const [status, res] of Object.entries(op.responses as Json)) {
        const codes = ((res as Json).content?.['application/json']?.schema?.properties?.error?.enum ?? []) as ErrorCode[];
        for (const c of codes) {
          expect(ERRORS[c]?.status, `${name} ${status} ${c}`).toBe(Number(status));
          expect((res as Json).description, `${name} ${status}`).toContain(c);
          seen.add(c);
        }
      }
    }
    expect(Object.keys(ERRORS).filter((c) => !seen.has(c))).toEqual([]);
    expect(doc.components.schemas.Error.properties.error.enum).toEqual(Object.keys(ERRORS));
  });

  test('documents the headers each route reads, and X-Request-Id on every operation and response', () => {
    const ops = operations(doc);
    const headersOf = (op: string) => (ops.get(op)!.parameters as Json[]).filter((p) => p.in === 'header').map((p) => p.name as string);
    expect(headersOf('PUT /v1/objects/{key}')).toEqual(
      expect.arrayContaining(['fencing-token', 'fence-key', 'writer-id', 'if-match', 'if-none-match', 'content-type', 'x-request-id']),
    );
    expect(headersOf('DELETE /v1/objects/{key}')).toEqual(
      expect.arrayContaining(['fencing-token', 'fence-key', 'writer-id', 'if-match', 'if-none-match']),
    );
    expect(headersOf('GET /v1/objects/{key}')).toEqual(expect.arrayContaining(['if-none-match']));
    expect(headersOf('PUT /v1/fences/{fenceKey}')).toEqual(expect.arrayContaining(['fencing-token', 'writer-id']));
    const get = ops.get('GET /v1/objects/{key}')!.responses as Json;
    expect(Object.keys(get[200].headers)).toEqual(expect.arrayContaining(['etag', 'object-version', 'fencing-token']));
    expect(get[304]).toBeDefined();
    for (const [name, op] of ops) {
      expect(headersOf(name), name).toContain('x-request-id');
      for (const [status, res] of Object.entries(op.responses as Json))
        expect(Object.keys((res as Json).headers ?? {}), `${name} ${status}`).toContain('x-request-id');
    }
  });

  test("its request schemas are the routes' validators", () => {
    const put = operations(doc).get('PUT /v1/objects/{key}')!;
    const param = (name: string) => (put.parameters as Json[]).find((p) => p.name === name)!;
    expect(param('key')).toMatchObject({ in: 'path', required: true, schema: { type: 'string', format: 'fencepost-key' } });
    expect(param('fencing-token')).toMatchObject({
      in: 'header',
      required: true,
      schema: { type: 'string', pattern: TOKEN.pattern, format: TOKEN.format },
    });
    const tx = operations(doc).get('POST /v1/transactions')!;
    const body = tx.requestBody.content['application/json'].schema as Json;
    expect(body.required).toEqual(['fences', 'statements']);
    expect(body.additionalProperties).toBe(false);
  });

  test('with keys, writes need the bearer key, and reads too when reads need a key', async () => {
    const secured = securedApp(db.pool, uniqueRole('oa'));
    try {
      const d = (await secured.inject({ url: '/openapi.json' })).json() as Json;
      expect(d.components.securitySchemes.bearer).toMatchObject({ type: 'http', scheme: 'bearer' });
      const ops = operations(d);
      expect(ops.get('PUT /v1/objects/{key}')!.security).toEqual([{ bearer: [] }]);
      expect(ops.get('GET /healthz')!.security).toBeUndefined();
      expect(operations(doc).get('PUT /v1/objects/{key}')!.security).toBeUndefined();
      // Documentation is open, even when everything else needs a key.
      expect((await secured.inject({ url: '/docs' })).statusCode).toBe(200);
      expect((await secured.inject({ url: '/v1/stats', headers: bearer(SECRET.reader) })).statusCode).toBe(200);
    } finally {
      await secured.close();
    }
  });
});

describe('GET /docs', () => {
  test('renders every operation and every error code, with no script and nothing from elsewhere', async () => {
    const res = await app.inject({ url: '/docs' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(res.headers['content-security-policy']).toMatch(/^default-src 'none'; style-src 'sha256-[A-Za-z0-9+/=]+'; /);
    const html = res.body;
    for (const name of operations(doc).keys()) {
      const [method, path] = name.split(' ') as [string, string];
      expect(html, name).toContain(
        `<span class="method ${method.toLowerCase()}">${method.toLowerCase()}</span> <code>${path.replace(/&/g, '&#38;')}</code>`,
      );
    }
    for (const code of Object.keys(ERRORS)) expect(html).toContain(`<code>${code}</code>`);
    expect(html).not.toMatch(/<script|\bsrc=|https?:\/\//i);
  });

  test('displays in Chromium with no error, no request but its own, under its CSP', async () => {
    let browser: Browser | undefined;
    const url = await listen(app);
    try {
      browser = await launchChromium();
      const page = await browser.newPage();
      const problems: string[] = [];
      const requests: string[] = [];
      page.on('console', (m) => m.type() === 'error' && problems.push(m.text()));
      page.on('pageerror', (e) => problems.push(e.message));
      page.on('request', (r) => requests.push(r.url()));
      const res = await page.goto(`${url}/docs`);
      expect(res?.status()).toBe(200);
      expect(await page.locator('article').count()).toBe(operations(doc).size);
      // The inline style applies (its hash is in the CSP): articles get their border.
      const style = (e: unknown) =>
        (globalThis as unknown as { getComputedStyle(e: unknown): { borderTopStyle: string } }).getComputedStyle(e).borderTopStyle;
      expect(await page.locator('article').first().evaluate(style)).toBe('solid');
      await page.screenshot({ path: 'test-artifacts/docs.png' });
      expect(problems).toEqual([]);
      expect(requests.filter((r) => !r.startsWith(url))).toEqual([]);
    } finally {
      await browser?.close();
    }
  });
});

describe('GET /', () => {
  test('points to the reference, the OpenAPI document and the dashboard: JSON, or HTML for browsers', async () => {
    const json = await app.inject({ url: '/' });
    expect(json.statusCode).toBe(200);
    expect(json.json()).toMatchObject({ docs: '/docs', openapi: '/openapi.json', dashboard: '/dashboard' });
    const html = await app.inject({ url: '/', headers: { accept: 'text/html,application/xhtml+xml' } });
    expect(html.headers['content-type']).toBe('text/html; charset=utf-8');
    for (const href of ['/docs', '/openapi.json', '/dashboard']) expect(html.body).toContain(`href="${href}"`);
  });
});
