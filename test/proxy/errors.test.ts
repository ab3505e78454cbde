// Every error code from the registry, each with its status and the shared body shape, and the
// guarantee that a refused request writes nothing.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance, InjectOptions } from 'fastify';
import pg from 'pg';
import { ERRORS, type ErrorCode } from '../../src/proxy/errors.ts';
import { freePort } from '../../src/zookeeper/local-server.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { REPO, testApp } from '../support/proxy.ts';

let db: TestDatabase;
let app: FastifyInstance;
const produced = new Set<ErrorCode>();

beforeAll(async () => {
  db = await createTestDatabase();
  app = testApp(db.pool, { bodyLimitBytes: 1024 });
  await app.ready();
});
afterAll(async () => {
  await app.close();
  await db.drop();
});

async function counts(): Promise<string> {
  const { rows } = await db.pool.query(
    `SELECT (SELECT count(*) FROM fencepost.objects) o, (SELECT count(*) FROM fencepost.fences) f,
            (SELECT coalesce(sum(accepted),0) FROM fencepost.fences) a`,
  );
  return JSON.stringify(rows[0]);
}

/** Sends the request and checks status, body shape and that no data changed. */
async function expectError(code: ErrorCode, req: InjectOptions, target: FastifyInstance = app) {
  const before = target === app ? await counts() : '';
  const res = await target.inject(req);
  expect(res.statusCode, res.body).toBe(ERRORS[code].status);
  const body = res.json();
  expect(body.error).toBe(code);
  expect(typeof body.message).toBe('string');
  if (target === app) expect(await counts()).toBe(before);
  produced.add(code);
  return res;
}

const putWith = (token: string | undefined, url = '/v1/objects/k', extra: Record<string, string> = {}): InjectOptions => ({
  method: 'PUT' as const,
  url,
  headers: { ...(token === undefined ? {} : { 'fencing-token': token }), ...extra },
  payload: 'data',
});

describe('token errors', () => {
  test('a fenced request without Fencing-Token gets 428 token_required', async () => {
    await expectError('token_required', putWith(undefined));
    await expectError('token_required', { method: 'DELETE', url: '/v1/objects/k' });
    await expectError('token_required', { method: 'PUT', url: '/v1/fences/k' });
  });

  test.each(['-1', '1e3', '0x10', '+5', ' 5', '5 ', '', '1.0', '١٢', '99999999999999999999', '9223372036854775808', '18446744073709551615', 'abc'])(
    'token %j gets 400 invalid_token',
    async (token) => {
      await expectError('invalid_token', putWith(token));
    },
  );

  test('a stale token gets 409 stale_token with the fence, the token and the highest token', async () => {
    await app.inject(putWith('50', '/v1/objects/stale'));
    const res = await expectError('stale_token', putWith('49', '/v1/objects/stale'));
    expect(res.json()).toEqual({ error: 'stale_token', message: expect.any(String), fenceKey: 'stale', token: '49', highestToken: '50' });
  });
});

describe('key errors', () => {
  test.each([
    ['empty', '/v1/objects/'],
    ['control character', '/v1/objects/a%00b'],
    ['newline', '/v1/objects/a%0Ab'],
    ['invalid UTF-8', '/v1/objects/%FF%FE'],
    ['bad percent-encoding', '/v1/objects/%zz'],
    ['1025 bytes', `/v1/objects/${encodeURIComponent('é'.repeat(512))}a`],
    ['empty fence key', '/v1/fences/'],
  ])('a key that is %s gets 400 invalid_key', async (_what, url) => {
    await expectError('invalid_key', putWith('1', url));
  });

  test('a key of exactly 1024 bytes is accepted', async () => {
    const res = await app.inject(putWith('1', `/v1/objects/${encodeURIComponent('é'.repeat(512))}`));
    expect(res.statusCode).toBe(200);
  });

  test('a bad Fence-Key header gets 400 invalid_key', async () => {
    await expectError('invalid_key', putWith('1', '/v1/objects/fk', { 'fence-key': '' }));
    await expectError('invalid_key', putWith('1', '/v1/objects/fk', { 'fence-key': 'x'.repeat(1025) }));
    await expectError('invalid_key', putWith('1', '/v1/objects/fk', { 'fence-key': 'a\u0001b' }));
  });
});

describe('other errors', () => {
  test('a body over the limit gets 413 payload_too_large', async () => {
    await expectError('payload_too_large', { method: 'PUT', url: '/v1/objects/big', headers: { 'fencing-token': '1' }, payload: Buffer.alloc(1025) });
  });

  test('an unknown route or object gets 404 not_found', async () => {
    await expectError('not_found', { url: '/v2/nothing' });
    await expectError('not_found', { url: '/v1/objects/never-written' });
  });

  test('a malformed limit gets 400 invalid_query', async () => {
    await expectError('invalid_query', { url: '/v1/fences?limit=0' });
    await expectError('invalid_query', { url: '/v1/stats?limit=abc' });
  });

  test('a malformed request gets 400 bad_request', async () => {
    await expectError('bad_request', { method: 'PUT', url: '/v1/objects/cl', headers: { 'fencing-token': '1', 'content-length': '10' }, payload: 'abc' });
  });

  test('an unreachable database gets 503 unavailable with Retry-After', async () => {
    const pool = new pg.Pool({ connectionString: `postgres://nobody:x@127.0.0.1:${await freePort()}/none`, connectionTimeoutMillis: 2000 });
    pool.on('error', () => {});
    const down = testApp(pool);
    try {
      const res = await expectError('unavailable', putWith('1'), down);
      expect(res.headers['retry-after']).toBe('1');
      await expectError('unavailable', { url: '/readyz' }, down);
      await expectError('unavailable', { url: '/v1/objects/x' }, down);
    } finally {
      await down.close();
      await pool.end();
    }
  });
});

test('every registry code except internal is produced above, and the README error table matches the registry', () => {
  const codes = Object.keys(ERRORS) as ErrorCode[];
  expect(codes.filter((c) => c !== 'internal' && !produced.has(c))).toEqual([]);
  const readme = readFileSync(join(REPO, 'README.md'), 'utf8');
  const rows = [...readme.matchAll(/^\| `([a-z_]+)` \| (\d{3}) \|/gm)].map((m) => [m[1], Number(m[2])]);
  expect(Object.fromEntries(rows)).toEqual(Object.fromEntries(codes.map((c) => [c, ERRORS[c].status])));
});
