// Pages cannot drive the proxy: a cross-site form post, a cross-origin fetch or a DNS-rebinding page
// gets refused before anything runs, and objects served back cannot run as pages of the proxy.
import { STORE_DEFAULTS } from '../../../src/proxy/config.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { request } from 'node:http';
import type { FastifyInstance, InjectOptions } from 'fastify';
import { buildApp } from '../../../src/proxy/http/app.ts';
import { FenceStore } from '../../../src/fence/store.ts';
import { ConfigError, loadConfig } from '../../../src/proxy/config.ts';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { listen, testApp } from '../../support/proxy.ts';
import { SECRET, adminQuery, bearer, securedApp, uniqueRole } from '../../support/keys.ts';

let db: TestDatabase;
/** Open mode, nothing allowed: what a proxy on a developer's machine runs. */
let open: FastifyInstance;
/** Open mode with an allowed page origin and an allowed host name. */
let allowing: FastifyInstance;
/** Keys configured. */
let keyed: FastifyInstance;
const role = uniqueRole('browser');
let n = 0;
const uniq = (p: string) => `${p}-${++n}`;

beforeAll(async () => {
  db = await createTestDatabase();
  await adminQuery(`CREATE ROLE ${role} NOLOGIN`);
  open = testApp(db.pool);
  allowing = buildApp({
    store: new FenceStore(db.pool, STORE_DEFAULTS),
    bodyLimitBytes: 1024 * 1024,
    transactions: { clientRole: clientRoleFor(db.pool) },
    browser: { allowedOrigins: ['https://ops.example.com'], allowedHosts: ['proxy'] },
  });
  keyed = securedApp(db.pool, role);
  await Promise.all([open.ready(), allowing.ready(), keyed.ready()]);
});
afterAll(async () => {
  await Promise.all([open.close(), allowing.close(), keyed.close()]);
  await db.drop();
  await adminQuery(`DROP ROLE IF EXISTS ${role}`).catch(() => {});
});

async function fenceRow(fenceKey: string) {
  return (await db.pool.query('SELECT highest_token FROM fencepost.fences WHERE fence_key = $1', [fenceKey])).rows[0] ?? null;
}
async function objectRow(key: string) {
  return (await db.pool.query('SELECT version FROM fencepost.objects WHERE key = $1', [key])).rows[0] ?? null;
}

/** A transaction raising fence `fenceKey` to 1, as text (a form can send any text, just not as JSON). */
const txBody = (fenceKey: string) => JSON.stringify({ fences: [{ key: fenceKey, token: '1' }], statements: [{ sql: 'SELECT 1 AS one' }] });
const tx = (fenceKey: string, headers: Record<string, string>): InjectOptions => ({
  method: 'POST',
  url: '/v1/transactions',
  headers,
  payload: txBody(fenceKey),
});
const put = (key: string, headers: Record<string, string>): InjectOptions => ({
  method: 'PUT',
  url: `/v1/objects/${encodeURIComponent(key)}`,
  headers: { 'fencing-token': '1', 'content-type': 'text/plain', ...headers },
  payload: 'v',
});

describe('POST /v1/transactions takes application/json only (a form cannot send it)', () => {
  test.each([
    'text/plain',
    'text/plain; charset=utf-8',
    'application/x-www-form-urlencoded',
    'multipart/form-data; boundary=x',
    'application/jsonx',
    'application/json-patch+json',
  ])('a transaction posted as %s gets 415 unsupported_media_type and nothing runs', async (type) => {
    const fence = uniq('form');
    const res = await open.inject(tx(fence, { 'content-type': type }));
    expect(res.statusCode, res.body).toBe(415);
    expect(res.json()).toMatchObject({ error: 'unsupported_media_type' });
    expect(await fenceRow(fence)).toBeNull();
  });

  test('a transaction without Content-Type gets 415 and nothing runs', async () => {
    const fence = uniq('untyped');
    const res = await open.inject({ method: 'POST', url: '/v1/transactions', payload: Buffer.from(txBody(fence)) });
    expect(res.statusCode, res.body).toBe(415);
    expect(await fenceRow(fence)).toBeNull();
  });

  test.each(['application/json', 'Application/JSON; charset=UTF-8', 'application/json;charset=utf-8'])(
    'a transaction posted as %s runs',
    async (type) => {
      const fence = uniq('json');
      const res = await open.inject(tx(fence, { 'content-type': type }));
      expect(res.statusCode, res.body).toBe(200);
      expect(await fenceRow(fence)).toEqual({ highest_token: '1' });
    },
  );

  test('with keys, a missing key is still 401 before the media type is looked at', async () => {
    expect((await keyed.inject(tx(uniq('keyed'), { 'content-type': 'text/plain' }))).statusCode).toBe(401);
    expect((await keyed.inject(tx(uniq('keyed'), { ...bearer(SECRET.writer), 'content-type': 'text/plain' }))).json().error).toBe(
      'unsupported_media_type',
    );
  });
});

describe('a request from another origin is refused unless its origin is allowed', () => {
  test('a cross-origin transaction gets 403 forbidden_origin and nothing runs', async () => {
    const fence = uniq('cross-tx');
    const res = await open.inject(tx(fence, { 'content-type': 'application/json', origin: 'https://evil.example' }));
    expect(res.statusCode, res.body).toBe(403);
    expect(res.json()).toMatchObject({ error: 'forbidden_origin' });
    expect(await fenceRow(fence)).toBeNull();
  });

  test('a cross-origin PUT gets 403 forbidden_origin and writes nothing, with keys too', async () => {
    const key = uniq('cross-put');
    expect((await open.inject(put(key, { origin: 'https://evil.example' }))).json().error).toBe('forbidden_origin');
    expect((await keyed.inject(put(`w/${key}`, { ...bearer(SECRET.writer), origin: 'https://evil.example' }))).json().error).toBe(
      'forbidden_origin',
    );
    expect(await objectRow(key)).toBeNull();
    expect(await objectRow(`w/${key}`)).toBeNull();
  });

  test('an opaque origin (Origin: null, e.g. a sandboxed page) and another port of the same host are foreign', async () => {
    expect((await open.inject(put(uniq('null-origin'), { origin: 'null' }))).statusCode).toBe(403);
    // app.inject's Host is localhost:80.
    expect((await open.inject(put(uniq('other-port'), { origin: 'http://localhost:8081' }))).statusCode).toBe(403);
    expect((await open.inject({ url: '/v1/stats', headers: { origin: 'https://evil.example' } })).statusCode).toBe(403);
  });

  test('an allowed origin passes, for a PUT and a transaction', async () => {
    const key = uniq('allowed-origin');
    expect((await allowing.inject(put(key, { origin: 'https://ops.example.com' }))).statusCode).toBe(200);
    const fence = uniq('allowed-origin-tx');
    const res = await allowing.inject(tx(fence, { 'content-type': 'application/json', origin: 'https://ops.example.com' }));
    expect(res.statusCode, res.body).toBe(200);
    expect(await fenceRow(fence)).toEqual({ highest_token: '1' });
    // Exact match only: another scheme or a subdomain is another origin.
    expect((await allowing.inject(put(uniq('near-miss'), { origin: 'http://ops.example.com' }))).statusCode).toBe(403);
    expect((await allowing.inject(put(uniq('near-miss'), { origin: 'https://x.ops.example.com' }))).statusCode).toBe(403);
  });

  test('a same-origin request (Origin host:port = Host, as the built-in dashboard sends) passes', async () => {
    expect((await open.inject(put(uniq('same-origin'), { origin: 'http://localhost' }))).statusCode).toBe(200);
    expect((await open.inject(put(uniq('same-origin'), { host: '127.0.0.1:8080', origin: 'http://127.0.0.1:8080' }))).statusCode).toBe(200);
    const fence = uniq('same-origin-tx');
    expect((await open.inject(tx(fence, { 'content-type': 'application/json', origin: 'http://localhost:80' }))).statusCode).toBe(200);
  });

  test('over real HTTP, a page of the proxy itself may write and a foreign page may not', async () => {
    const app = testApp(db.pool);
    try {
      const url = await listen(app);
      const key = uniq('http');
      const send = (origin: string) =>
        new Promise<number>((resolve, reject) => {
          const req = request(
            `${url}/v1/objects/${key}`,
            { method: 'PUT', headers: { origin, 'fencing-token': '1', 'content-type': 'text/plain' } },
            (res) => {
              res.resume();
              resolve(res.statusCode ?? 0);
            },
          );
          req.on('error', reject);
          req.end('v');
        });
      expect(await send(url)).toBe(200);
      expect(await send('http://evil.example')).toBe(403);
    } finally {
      await app.close();
    }
  });
});

describe('open mode answers only to IP addresses, localhost and allowed host names (DNS rebinding)', () => {
  test('a request for evil.example:8080 gets 403 forbidden_host and writes nothing', async () => {
    const key = uniq('rebound');
    const res = await open.inject(put(key, { host: 'evil.example:8080' }));
    expect(res.statusCode, res.body).toBe(403);
    expect(res.json()).toMatchObject({ error: 'forbidden_host' });
    expect(await objectRow(key)).toBeNull();
    const fence = uniq('rebound-tx');
    expect((await open.inject(tx(fence, { host: 'evil.example:8080', 'content-type': 'application/json' }))).json().error).toBe(
      'forbidden_host',
    );
    expect(await fenceRow(fence)).toBeNull();
    expect((await open.inject({ url: '/v1/stats', headers: { host: 'evil.example:8080' } })).statusCode).toBe(403);
  });

  test('a rebound page is same-origin with its own name, and still refused', async () => {
    const res = await open.inject(put(uniq('rebound-same-origin'), { host: 'evil.example:8080', origin: 'http://evil.example:8080' }));
    expect(res.json().error).toBe('forbidden_host');
  });

  test.each(['localhost:1234', 'LOCALHOST', '127.0.0.1', '127.0.0.1:8080', '[::1]:8080', '10.1.2.3:80'])('Host %s passes', async (host) => {
    expect((await open.inject(put(uniq('host-ok'), { host }))).statusCode).toBe(200);
  });

  test('an allowed host name passes, in any case and on any port; others still do not', async () => {
    expect((await allowing.inject(put(uniq('allowed-host'), { host: 'proxy:8080' }))).statusCode).toBe(200);
    expect((await allowing.inject(put(uniq('allowed-host'), { host: 'Proxy' }))).statusCode).toBe(200);
    expect((await allowing.inject(put(uniq('allowed-host'), { host: 'proxy.evil.example' }))).statusCode).toBe(403);
  });

  test('with keys configured the Host is not checked (bearer keys protect)', async () => {
    const res = await keyed.inject(put(`w/${uniq('keyed-host')}`, { ...bearer(SECRET.writer), host: 'evil.example:8080' }));
    expect(res.statusCode, res.body).toBe(200);
  });

  test('over real HTTP, Host 127.0.0.1:port passes', async () => {
    const app = testApp(db.pool);
    try {
      const url = await listen(app);
      expect((await fetch(`${url}/v1/stats`)).status).toBe(200);
    } finally {
      await app.close();
    }
  });
});

describe('objects served back cannot run as pages of the proxy', () => {
  test('GET of an object sends X-Content-Type-Options: nosniff and Content-Security-Policy: sandbox', async () => {
    const key = uniq('page');
    await open.inject({
      method: 'PUT',
      url: `/v1/objects/${key}`,
      headers: { 'fencing-token': '1', 'content-type': 'text/html' },
      payload: '<script>fetch("/v1/transactions")</script>',
    });
    const res = await open.inject({ url: `/v1/objects/${key}` });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toBe('text/html');
    expect(res.headers['x-content-type-options']).toBe('nosniff');
    expect(res.headers['content-security-policy']).toBe('sandbox');
  });
});

describe('configuration', () => {
  test('FENCEPOST_ALLOWED_ORIGINS and FENCEPOST_ALLOWED_HOSTS default to none and are frozen', () => {
    const c = loadConfig({});
    expect(c.allowedOrigins).toEqual([]);
    expect(c.allowedHosts).toEqual([]);
    const set = loadConfig({
      FENCEPOST_ALLOWED_ORIGINS: 'https://ops.example.com, http://127.0.0.1:3000',
      FENCEPOST_ALLOWED_HOSTS: 'proxy,Fencepost.internal',
    });
    expect(set.allowedOrigins).toEqual(['https://ops.example.com', 'http://127.0.0.1:3000']);
    expect(set.allowedHosts).toEqual(['proxy', 'fencepost.internal']);
    expect(Object.isFrozen(set.allowedOrigins) && Object.isFrozen(set.allowedHosts)).toBe(true);
  });

  test.each([
    ['FENCEPOST_ALLOWED_ORIGINS', 'ops.example.com'],
    ['FENCEPOST_ALLOWED_ORIGINS', 'https://ops.example.com/'],
    ['FENCEPOST_ALLOWED_ORIGINS', 'https://OPS.example.com'],
    ['FENCEPOST_ALLOWED_ORIGINS', 'https://ops.example.com:443'],
    ['FENCEPOST_ALLOWED_ORIGINS', 'ftp://ops.example.com'],
    ['FENCEPOST_ALLOWED_ORIGINS', 'null'],
    ['FENCEPOST_ALLOWED_ORIGINS', 'https://a.example,,https://b.example'],
    ['FENCEPOST_ALLOWED_HOSTS', 'proxy:8080'],
    ['FENCEPOST_ALLOWED_HOSTS', 'http://proxy'],
    ['FENCEPOST_ALLOWED_HOSTS', '10.0.0.1'],
    ['FENCEPOST_ALLOWED_HOSTS', 'bad name'],
  ])('%s=%j stops the start naming the variable', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(`^${name}: `));
  });
});
