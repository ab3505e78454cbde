// GET /v1/objects?prefix=&after=&limit=: objects in byte order of their keys, paged by key; and
// object keys holding `/` as it is or as %2F.
import { describe, expect } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { listObjects, prefixEnd } from '../../../src/fence/sql/objects.ts';
import { appTest as test } from '../../support/fixtures.ts';

const put = (app: FastifyInstance, key: string, body = 'x', headers: Record<string, string> = {}) =>
  app.inject({
    method: 'PUT',
    url: `/v1/objects/${encodeURIComponent(key)}`,
    headers: { 'fencing-token': '1', 'content-type': 'text/plain', ...headers },
    payload: body,
  });

type Listed = {
  key: string;
  fenceKey: string;
  token: string;
  version: number;
  etag: string;
  contentType: string;
  size: number;
  updatedAt: string;
};
type Page = { objects: Listed[]; next: string | null };

const list = async (app: FastifyInstance, query: string): Promise<Page> => {
  const res = await app.inject({ url: `/v1/objects${query}` });
  expect(res.statusCode, res.body).toBe(200);
  return res.json() as Page;
};

/** Every key under `prefix`, following `next` with pages of `limit`. */
async function walk(app: FastifyInstance, prefix: string, limit: number): Promise<string[]> {
  const seen: string[] = [];
  let after: string | null = null;
  for (let pages = 0; pages < 1000; pages++) {
    const page: Page = await list(
      app,
      `?prefix=${encodeURIComponent(prefix)}&limit=${limit}${after === null ? '' : `&after=${encodeURIComponent(after)}`}`,
    );
    expect(page.objects.length).toBeLessThanOrEqual(limit);
    seen.push(...page.objects.map((o) => o.key));
    if (page.next === null) return seen;
    after = page.next;
  }
  throw new Error('no end of listing');
}

const byteOrder = (a: string, b: string) => Buffer.compare(Buffer.from(a), Buffer.from(b));

// Keys whose byte order differs from most collations' order: case, accents, symbols, U+10FFFF.
const KEYS = [
  'ls/B',
  'ls/a',
  'ls/a/1',
  'ls/a/2',
  'ls/a-b',
  'ls/ä',
  'ls/é',
  'ls/Z',
  'ls/€',
  'ls/\u{10FFFF}',
  'ls/\u{10FFFF}x',
  'ls/z',
  'ls0',
  'ls',
];

describe('GET /v1/objects', () => {
  test.beforeAll(async ({ app }) => {
    for (const k of KEYS) expect((await put(app, k, `body of ${k}`)).statusCode).toBe(200);
  });

  test('lists objects in byte order with key, fence key, token, version, ETag, content type, size and time', async ({ app }) => {
    const page = await list(app, '?prefix=ls');
    expect(page.objects.map((o) => o.key)).toEqual([...KEYS].sort(byteOrder));
    expect(page.next).toBeNull();
    const a = page.objects.find((o) => o.key === 'ls/a')!;
    const read = await app.inject({ url: '/v1/objects/ls/a' });
    expect(a).toEqual({
      key: 'ls/a',
      fenceKey: 'ls/a',
      token: '1',
      version: 1,
      etag: read.headers.etag,
      contentType: 'text/plain',
      size: Buffer.byteLength('body of ls/a'),
      updatedAt: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
    });
  });

  test('pages through every object exactly once, in order, with after = next', async ({ app }) => {
    for (const limit of [1, 2, 3, 5]) expect(await walk(app, 'ls', limit)).toEqual([...KEYS].sort(byteOrder));
  });

  test('a prefix keeps exactly the keys that start with it, including after the last code point', async ({ app }) => {
    for (const prefix of ['ls/', 'ls/a', 'ls/a/', 'ls/\u{10FFFF}', 'ls/é', 'ls/q', 'ls0', 'lt']) {
      const want = KEYS.filter((k) => k.startsWith(prefix)).sort(byteOrder);
      expect(await walk(app, prefix, 2), prefix).toEqual(want);
    }
  });

  test('after may lie before, inside or past the prefix', async ({ app }) => {
    const keys = async (q: string) => (await list(app, q)).objects.map((o) => o.key);
    expect(await keys('?prefix=ls/a&after=ls/')).toEqual(['ls/a', 'ls/a-b', 'ls/a/1', 'ls/a/2']);
    expect(await keys('?prefix=ls/a&after=ls/a-b')).toEqual(['ls/a/1', 'ls/a/2']);
    expect(await keys('?prefix=ls/a&after=ls/b')).toEqual([]);
  });

  test('nothing counts: a listing of the whole table answers with an empty prefix too', async ({ app }) => {
    expect((await list(app, '?prefix=&limit=1000')).objects.length).toBeGreaterThanOrEqual(KEYS.length);
    expect((await list(app, '')).objects.length).toBeGreaterThanOrEqual(KEYS.length);
  });

  test('a malformed prefix, after or limit, or an unknown parameter, gets 400', async ({ app }) => {
    for (const [query, code] of [
      ['?prefix=a%01', 'invalid_query'],
      ['?after=', 'invalid_key'],
      ['?limit=0', 'invalid_query'],
      ['?limit=1001', 'invalid_query'],
      ['?prefix=a&prefix=b', 'invalid_query'],
      ['?fenceKey=x', 'invalid_query'],
    ] as const) {
      const res = await app.inject({ url: `/v1/objects${query}` });
      expect(res.statusCode, query).toBe(400);
      expect(res.json().error, query).toBe(code);
    }
  });

  test('the listing can walk the byte-order index from its cursor, in order, without sorting', async ({ db }) => {
    const client = await db.pool.connect();
    try {
      // A table this small is cheaper to scan whole; forbid that to see the plan a large one gets.
      await client.query('SET enable_seqscan = off; SET enable_bitmapscan = off');
      for (const [prefix, after] of [
        ['ls/', 'ls/a'],
        ['', null],
        ['', 'ls/a'],
        ['ls/', null],
      ] as const) {
        const q = listObjects(prefix, after, 3);
        const { rows } = await client.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${String(q.text)}`, q.values);
        const plan = rows.map((r) => r['QUERY PLAN']).join('\n');
        expect(plan, q.name).toMatch(/Index Scan using objects_key_bytes/);
        expect(plan, q.name).not.toMatch(/Sort/);
      }
    } finally {
      await client.query('RESET enable_seqscan; RESET enable_bitmapscan');
      client.release();
    }
  });
});

describe('keys with /', () => {
  test('a key may hold / as it is or as %2F: both name the same object', async ({ app }) => {
    const raw = await app.inject({ method: 'PUT', url: '/v1/objects/orders/7', headers: { 'fencing-token': '1' }, payload: 'seven' });
    expect(raw.statusCode).toBe(200);
    expect(raw.json().key).toBe('orders/7');
    expect((await app.inject({ url: '/v1/objects/orders%2F7' })).body).toBe('seven');
    const encoded = await app.inject({ method: 'PUT', url: '/v1/objects/orders%2F7', headers: { 'fencing-token': '1' }, payload: 'again' });
    expect(encoded.json().version).toBe(2);
    expect((await app.inject({ url: '/v1/objects/orders/7' })).body).toBe('again');
    expect((await app.inject({ method: 'DELETE', url: '/v1/objects/orders/7', headers: { 'fencing-token': '1' } })).statusCode).toBe(204);
    expect((await app.inject({ url: '/v1/objects/orders%2F7' })).statusCode).toBe(404);
  });

  test('a stale token on a key with / is refused like any other', async ({ app }) => {
    await app.inject({ method: 'PUT', url: '/v1/objects/deep/a/b/c', headers: { 'fencing-token': '9' }, payload: 'x' });
    const res = await app.inject({ method: 'PUT', url: '/v1/objects/deep/a/b/c', headers: { 'fencing-token': '8' }, payload: 'y' });
    expect(res.statusCode).toBe(409);
    expect(res.json()).toMatchObject({ error: 'stale_token', fenceKey: 'deep/a/b/c' });
  });

  test('an empty key, a control character or bad percent-encoding still gets invalid_key', async ({ app }) => {
    for (const url of ['/v1/objects/', '/v1/objects/a/%01', '/v1/objects/a/%zz', `/v1/objects/a/${'x'.repeat(1024)}`]) {
      for (const method of ['GET', 'PUT', 'DELETE'] as const) {
        const res = await app.inject({ method, url, headers: { 'fencing-token': '1' }, payload: method === 'PUT' ? 'x' : undefined });
        expect(res.statusCode, `${method} ${url}`).toBe(400);
        expect(res.json().error, `${method} ${url}`).toBe('invalid_key');
      }
    }
    expect((await app.inject({ url: '/v1/objects/' })).json().message).toBe('key is empty');
  });
});

describe('prefixEnd', () => {
  test('is the least string above every string with the prefix, in code point order', () => {
    expect(prefixEnd('a')).toBe('b');
    expect(prefixEnd('ab/')).toBe('ab0');
    expect(prefixEnd('a\u{10FFFF}')).toBe('b');
    expect(prefixEnd('\u{10FFFF}\u{10FFFF}')).toBeNull();
    expect(prefixEnd('\uD7FF')).toBe('\uE000');
    expect(prefixEnd('\uFFFF')).toBe('\u{10000}');
  });
});
