// Requests are validated by fastify route schemas (src/proxy/http/validation.ts): every route declares
// what it reads, objects refuse unknown fields, arrays are bounded, and each schema failure answers
// with its registry code.
import { STORE_DEFAULTS } from '../../../src/proxy/config.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { FastifyInstance, InjectOptions, RouteOptions } from 'fastify';
import { buildApp } from '../../../src/proxy/http/app.ts';
import { FenceStore } from '../../../src/fence/store.ts';
import { ERRORS, type ErrorCode } from '../../../src/proxy/errors.ts';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../../support/db.ts';

const MAX_STATEMENTS = 3;
let db: TestDatabase;
let app: FastifyInstance;
const routes: RouteOptions[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  app = buildApp({
    store: new FenceStore(db.pool, STORE_DEFAULTS),
    bodyLimitBytes: 1024 * 1024,
    transactions: { clientRole: clientRoleFor(db.pool), maxStatements: MAX_STATEMENTS },
  });
  // Route plugins load at ready(), after this hook is in place: it sees every route.
  app.addHook('onRoute', (route) => {
    routes.push(route);
  });
  await app.ready();
});
afterAll(async () => {
  await app.close();
  await db.drop();
});

type Schema = {
  type?: string | string[];
  properties?: Record<string, Schema>;
  items?: Schema;
  additionalProperties?: unknown;
  maxItems?: number;
  required?: string[];
  pattern?: string;
};

/** Paths (in the schema) of objects that allow unknown fields and arrays without maxItems. */
function looseSpots(s: Schema, at = ''): string[] {
  const types = Array.isArray(s.type) ? s.type : [s.type];
  const out: string[] = [];
  if (types.includes('object') && s.additionalProperties !== false) out.push(`${at || '/'} allows unknown fields`);
  if (types.includes('array') && s.maxItems === undefined) out.push(`${at || '/'} has no maxItems`);
  for (const [name, p] of Object.entries(s.properties ?? {})) out.push(...looseSpots(p, `${at}/${name}`));
  if (s.items) out.push(...looseSpots(s.items, `${at}/items`));
  return out;
}

const methodsOf = (r: RouteOptions) => (Array.isArray(r.method) ? r.method : [r.method]);
const schemaOf = (r: RouteOptions) => (r.schema ?? {}) as { body?: Schema; querystring?: Schema; params?: Schema; headers?: Schema };

// Not the API: probes, scrapers and browsers may add query parameters these routes never read.
const OPS_ROUTES = [
  '/healthz',
  '/readyz',
  '/metrics',
  '/dashboard',
  '/dashboard/dashboard.js',
  '/dashboard/dashboard.css',
  '/',
  '/openapi.json',
  '/docs',
];

describe('every route declares what it reads', () => {
  test('the route list is complete', () => {
    const urls = new Set(routes.map((r) => r.url));
    for (const u of [
      '/v1/objects/*',
      '/v1/objects',
      '/v1/fences/:fenceKey',
      '/v1/fences',
      '/v1/stats',
      '/v1/rejections',
      '/v1/rejections/histogram',
      '/v1/transactions',
      ...OPS_ROUTES,
    ])
      expect(urls).toContain(u);
  });

  test('every API route has a querystring schema, every route with a body or a path parameter a schema for it; all refuse unknown fields and bound their arrays', () => {
    const problems: string[] = [];
    for (const r of routes) {
      const name = `${methodsOf(r).join(',')} ${r.url}`;
      const schema = schemaOf(r);
      if (!r.url.startsWith('/v1/')) {
        if (!OPS_ROUTES.includes(r.url)) problems.push(`${name}: neither an API route nor a listed ops route`);
        continue;
      }
      if (schema.querystring === undefined) problems.push(`${name}: no querystring schema`);
      // Object bodies (PUT /v1/objects/:key) are raw bytes; every JSON body is a POST.
      if (methodsOf(r).includes('POST') && schema.body === undefined) problems.push(`${name}: no body schema`);
      // `:name` parameters, and `*`: the object key of /v1/objects/*.
      const params = [...r.url.matchAll(/:([A-Za-z]+)|(\*)$/g)].map((m) => m[1] ?? m[2]!);
      if (params.length > 0) {
        if (schema.params === undefined) problems.push(`${name}: no params schema`);
        else
          for (const p of params) if (!schema.params.required?.includes(p)) problems.push(`${name}: params schema does not require ${p}`);
      }
      for (const part of ['body', 'querystring', 'params'] as const) {
        const s = schema[part];
        if (s !== undefined) problems.push(...looseSpots(s).map((p) => `${name}: ${part} ${p}`));
      }
    }
    expect(problems).toEqual([]);
  });

  test('every fenced write outside a transaction body requires a Fencing-Token header in its schema', () => {
    const fenced = routes.filter((r) => r.config?.operation !== undefined && r.config.operation !== 'transaction');
    expect(fenced.length).toBeGreaterThanOrEqual(3);
    for (const r of fenced) expect(schemaOf(r).headers?.required, `${r.method} ${r.url}`).toContain('fencing-token');
  });

  test.each([
    ['/v1/stats', 'limit', 1000],
    ['/v1/rejections/histogram', 'minutes', 1440],
  ])('%s ?%s= admits exactly 1…%i in at most four digits, leading zeros allowed', (url, param, max) => {
    const pattern = routes.find((r) => r.url === url)?.schema?.querystring as Schema | undefined;
    const re = new RegExp(pattern!.properties![param]!.pattern!, 'u');
    const wrong: string[] = [];
    for (let len = 1; len <= 5; len++) {
      for (let n = 0; n < 10 ** len; n++) {
        const s = String(n).padStart(len, '0');
        if (re.test(s) !== (len <= 4 && n >= 1 && n <= max)) wrong.push(s);
      }
    }
    for (const s of ['', ' 5', '5 ', '+5', '-5', '1e2', '0x10', '1.0', '١٢', '5\n']) if (re.test(s)) wrong.push(JSON.stringify(s));
    expect(wrong).toEqual([]);
  });
});

/** Sends the request; checks the registry code, its status and the body shape. */
async function expectCode(code: ErrorCode, req: InjectOptions): Promise<string> {
  const res = await app.inject(req);
  expect(res.statusCode, `${req.method ?? 'GET'} ${String(req.url)}: ${res.body}`).toBe(ERRORS[code].status);
  const body = res.json() as { error: string; message: unknown };
  expect(body.error, res.body).toBe(code);
  expect(typeof body.message).toBe('string');
  return body.message as string;
}

describe('schema failures answer with registry codes', () => {
  test('PUT and DELETE /v1/objects/:key: token, key and query', async () => {
    for (const method of ['PUT', 'DELETE'] as const) {
      expect(await expectCode('token_required', { method, url: '/v1/objects/k' })).toMatch(/Fencing-Token/);
      expect(await expectCode('invalid_token', { method, url: '/v1/objects/k', headers: { 'fencing-token': '0x10' } })).toMatch(
        /Fencing-Token/,
      );
      await expectCode('invalid_token', { method, url: '/v1/objects/k', headers: { 'fencing-token': '9223372036854775808' } });
      expect(await expectCode('invalid_key', { method, url: '/v1/objects/a%01b', headers: { 'fencing-token': '1' } })).toMatch(
        /control character/,
      );
      expect(await expectCode('invalid_query', { method, url: '/v1/objects/k?version=2', headers: { 'fencing-token': '1' } })).toMatch(
        /"version"/,
      );
    }
    // The body stays raw bytes whatever its type: JSON-looking, invalid UTF-8, or typed as JSON.
    const res = await app.inject({
      method: 'PUT',
      url: '/v1/objects/raw',
      headers: { 'fencing-token': '1', 'content-type': 'application/json' },
      payload: Buffer.from([0x7b, 0xff, 0x00]),
    });
    expect(res.statusCode, res.body).toBe(200);
    expect((await app.inject({ url: '/v1/objects/raw' })).rawPayload).toEqual(Buffer.from([0x7b, 0xff, 0x00]));
  });

  test('GET /v1/objects/:key and /v1/fences/:fenceKey: key and query', async () => {
    expect(await expectCode('invalid_key', { url: `/v1/objects/${'x'.repeat(1025)}` })).toMatch(/1024 bytes/);
    await expectCode('invalid_query', { url: '/v1/objects/k?x=1' });
    await expectCode('invalid_key', { url: `/v1/fences/${encodeURIComponent('é'.repeat(513))}` });
    await expectCode('invalid_query', { url: '/v1/fences/k?x=1' });
  });

  test('PUT /v1/fences/:fenceKey: token and key', async () => {
    await expectCode('token_required', { method: 'PUT', url: '/v1/fences/f' });
    await expectCode('invalid_token', { method: 'PUT', url: '/v1/fences/f', headers: { 'fencing-token': '-1' } });
    await expectCode('invalid_key', { method: 'PUT', url: '/v1/fences/a%7Fb', headers: { 'fencing-token': '1' } });
  });

  test('GET /v1/fences and /v1/stats: limit, after, unknown and repeated parameters', async () => {
    for (const q of ['limit=0', 'limit=1001', 'limit=abc', 'limit=1&limit=2', 'limit=', 'after=a&after=b', 'sort=asc'])
      await expectCode('invalid_query', { url: `/v1/fences?${q}` });
    expect(await expectCode('invalid_query', { url: '/v1/fences?limit=5&limit=5' })).toMatch(/more than once/);
    await expectCode('invalid_key', { url: '/v1/fences?after=' });
    await expectCode('invalid_key', { url: '/v1/fences?after=a%00b' });
    for (const q of ['limit=-1', 'limit=1e2', 'limit=%205', 'x=1']) await expectCode('invalid_query', { url: `/v1/stats?${q}` });
    expect((await app.inject({ url: '/v1/stats?limit=0010' })).statusCode).toBe(200);
    expect((await app.inject({ url: '/v1/fences?limit=1000&after=k' })).statusCode).toBe(200);
  });

  test('GET /v1/rejections and /v1/rejections/histogram: before, minutes, fenceKey', async () => {
    for (const q of [
      'before=0',
      'before=-1',
      'before=9223372036854775808',
      'before=00000000000000000001',
      'before=1&before=2',
      'fenceKey=a&fenceKey=b',
      'minutes=5',
    ]) {
      await expectCode('invalid_query', { url: `/v1/rejections?${q}` });
    }
    await expectCode('invalid_key', { url: '/v1/rejections?fenceKey=' });
    expect((await app.inject({ url: '/v1/rejections?before=9223372036854775807&limit=1&fenceKey=f' })).statusCode).toBe(200);
    for (const q of ['minutes=0', 'minutes=1441', 'minutes=1.5', 'limit=5'])
      await expectCode('invalid_query', { url: `/v1/rejections/histogram?${q}` });
    await expectCode('invalid_key', { url: '/v1/rejections/histogram?fenceKey=%01' });
  });

  describe('POST /v1/transactions', () => {
    const fences = [{ key: 'v/a', token: '1' }];
    const statements = [{ sql: 'SELECT 1' }];
    const tx = (body: unknown, headers: Record<string, string> = { 'content-type': 'application/json' }): InjectOptions => ({
      method: 'POST',
      url: '/v1/transactions',
      headers,
      payload: typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body),
    });

    test.each<[string, unknown, ErrorCode]>([
      ['a token sent as a number', { fences: [{ key: 'v/a', token: 5 }], statements }, 'invalid_token'],
      ['a token out of range', { fences: [{ key: 'v/a', token: '9223372036854775808' }], statements }, 'invalid_token'],
      ['a fence without a token', { fences: [{ key: 'v/a' }], statements }, 'token_required'],
      ['an empty fence key', { fences: [{ key: '', token: '1' }], statements }, 'invalid_key'],
      ['101 fences', { fences: Array.from({ length: 101 }, (_, i) => ({ key: `v/${i}`, token: '1' })), statements }, 'too_many_statements'],
      [
        `${MAX_STATEMENTS + 1} statements (the configured maximum is ${MAX_STATEMENTS})`,
        { fences, statements: Array.from({ length: MAX_STATEMENTS + 1 }, () => ({ sql: 'SELECT 1' })) },
        'too_many_statements',
      ],
      ['no fences', { fences: [], statements }, 'invalid_transaction'],
      ['no statements', { fences }, 'invalid_transaction'],
      ['an unknown top-level field', { fences, statements, extra: 1 }, 'invalid_transaction'],
      ['an unknown fence field', { fences: [{ key: 'v/a', token: '1', ttl: 5 }], statements }, 'invalid_transaction'],
      ['an unknown statement field', { fences, statements: [{ sql: 'SELECT 1', name: 'x' }] }, 'invalid_transaction'],
      ['an unknown isolation', { fences, statements, isolation: 'snapshot' }, 'invalid_transaction'],
      ['blank SQL', { fences, statements: [{ sql: ' \n\t' }] }, 'invalid_transaction'],
      ['SQL with a NUL', { fences, statements: [{ sql: 'SELECT 1\u0000' }] }, 'invalid_transaction'],
      ['params that are not an array', { fences, statements: [{ sql: 'SELECT $1', params: { a: 1 } }] }, 'invalid_transaction'],
      ['more than 65535 params', { fences, statements: [{ sql: 'SELECT 1', params: Array(65536).fill(0) }] }, 'invalid_transaction'],
      [
        'params nested deeper than 16',
        { fences, statements: [{ sql: 'SELECT $1', params: [JSON.parse('['.repeat(17) + ']'.repeat(17))] }] },
        'invalid_transaction',
      ],
      ['a fence key twice', { fences: [fences[0], fences[0]], statements }, 'invalid_transaction'],
      ['a body that is not an object', [fences, statements], 'invalid_transaction'],
      ['invalid JSON', '{"fences":', 'invalid_transaction'],
      ['an empty body', '', 'invalid_transaction'],
      [
        'invalid UTF-8 inside a string',
        Buffer.concat([
          Buffer.from('{"fences":[{"key":"v/'),
          Buffer.from([0xff]),
          Buffer.from('","token":"1"}],"statements":[{"sql":"SELECT 1"}]}'),
        ]),
        'invalid_transaction',
      ],
    ])('%s is refused', async (_what, body, code) => {
      await expectCode(code, tx(body));
    });

    test('the content type is checked before the body: 415 unsupported_media_type even for an invalid body', async () => {
      await expectCode('unsupported_media_type', tx('not json', { 'content-type': 'text/plain' }));
      await expectCode('unsupported_media_type', tx({ fences: 5 }, {}));
    });

    test('null isolation and params mean the defaults, and a JSON type with parameters is JSON', async () => {
      const res = await app.inject(
        tx(
          { fences: [{ key: 'v/defaults', token: '1' }], statements: [{ sql: 'SELECT 1 AS one', params: null }], isolation: null },
          { 'content-type': 'Application/JSON; charset=utf-8' },
        ),
      );
      expect(res.statusCode, res.body).toBe(200);
      expect(res.json()).toEqual({ results: [{ rowCount: 1, rows: [{ one: 1 }] }] });
    });
  });
});
