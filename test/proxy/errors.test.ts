// Every error code from the registry, each with its status and the shared body shape, and the
// guarantee that a refused request writes nothing.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance, InjectOptions } from 'fastify';
import pg from 'pg';
import { ERRORS, type ErrorCode } from '../../src/proxy/errors.ts';
import { closedPort } from '../../tools/ports.ts';
import { TcpProxy } from '../../tools/faults/tcp-proxy.ts';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../support/db.ts';
import { REPO, listen, testApp } from '../support/proxy.ts';
import { protectTable } from '../../src/fence/protect.ts';
import { SECRET, adminQuery, bearer, rawHttp, securedApp, uniqueRole } from '../support/keys.ts';
import { inject } from 'vitest';
import { DurabilityMonitor } from '../../src/fence/durability-monitor.ts';

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
            (SELECT coalesce(sum(accepted),0) FROM fencepost.fence_counts) a`,
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

  test.each([
    '-1',
    '1e3',
    '0x10',
    '+5',
    ' 5',
    '5 ',
    '',
    '1.0',
    '١٢',
    '99999999999999999999',
    '9223372036854775808',
    '18446744073709551615',
    'abc',
  ])('token %j gets 400 invalid_token', async (token) => {
    await expectError('invalid_token', putWith(token));
  });

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
    await expectError('payload_too_large', {
      method: 'PUT',
      url: '/v1/objects/big',
      headers: { 'fencing-token': '1' },
      payload: Buffer.alloc(1025),
    });
  });

  test('an unknown route or object gets 404 not_found', async () => {
    await expectError('not_found', { url: '/v2/nothing' });
    await expectError('not_found', { url: '/v1/objects/never-written' });
  });

  test('a conditional write whose If-Match or If-None-Match: * does not hold gets 412 precondition_failed', async () => {
    await app.inject(putWith('3', '/v1/objects/cond'));
    await expectError('precondition_failed', putWith('3', '/v1/objects/cond', { 'if-none-match': '*' }));
    await expectError('precondition_failed', putWith('3', '/v1/objects/cond', { 'if-match': '"0.0"' }));
    await expectError('precondition_failed', {
      method: 'DELETE',
      url: '/v1/objects/cond',
      headers: { 'fencing-token': '3', 'if-match': '"0.0"' },
    });
  });

  test('a malformed limit gets 400 invalid_query', async () => {
    await expectError('invalid_query', { url: '/v1/fences?limit=0' });
    await expectError('invalid_query', { url: '/v1/stats?limit=abc' });
  });

  test('a malformed request gets 400 bad_request', async () => {
    await expectError('bad_request', {
      method: 'PUT',
      url: '/v1/objects/cl',
      headers: { 'fencing-token': '1', 'content-length': '10' },
      payload: 'abc',
    });
  });

  test('an unreachable database gets 503 unavailable with Retry-After', async () => {
    const pool = new pg.Pool({
      connectionString: `postgres://nobody:x@127.0.0.1:${await closedPort()}/none`,
      connectionTimeoutMillis: 2000,
    });
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

describe('security errors (keys, transactions, forgery guard, HTTP limits)', () => {
  let secured: FastifyInstance;
  let url: string;
  const role = uniqueRole('err');
  const tx = (statements: unknown[], fences: unknown[] = [{ key: 'w/tx', token: '1' }], key = SECRET.writer): InjectOptions => ({
    method: 'POST',
    url: '/v1/transactions',
    headers: { ...bearer(key), 'content-type': 'application/json' },
    payload: JSON.stringify({ fences, statements }),
  });

  beforeAll(async () => {
    await adminQuery(`CREATE ROLE ${role} NOLOGIN`);
    await db.pool.query(`CREATE TABLE public.err_t (id int PRIMARY KEY)`);
    await db.pool.query(`GRANT SELECT, INSERT ON public.err_t TO ${role}`);
    await db.pool.query(`CREATE TABLE public.err_protected (id int PRIMARY KEY); GRANT SELECT, INSERT ON public.err_protected TO ${role}`);
    await protectTable(db.pool, 'public.err_protected', 'w/protected');
    secured = securedApp(db.pool, role, {
      forgeryGuard: { zkConnect: inject('zkConnect'), mappings: [{ prefix: 'w/guarded/', electionPath: `/fencepost-test/err-${role}` }] },
      requestTimeoutMs: 300,
    });
    url = await listen(secured);
  });
  afterAll(async () => {
    await secured.close();
    await db.pool.query(`DROP TABLE public.err_t, public.err_protected; REVOKE ALL ON SCHEMA public FROM ${role}`).catch(() => {});
    await adminQuery(`DROP OWNED BY ${role}; DROP ROLE ${role}`).catch(() => {});
  });

  test('a missing or unknown bearer key gets 401 unauthorized; a read-only key writing or a key outside its prefixes 403 forbidden', async () => {
    const res = await expectError('unauthorized', putWith('1', '/v1/objects/w%2Fa'), secured);
    expect(res.headers['www-authenticate']).toBe('Bearer');
    await expectError('unauthorized', putWith('1', '/v1/objects/w%2Fa', { authorization: 'Bearer not-a-configured-key-at-all' }), secured);
    await expectError('forbidden', putWith('1', '/v1/objects/w%2Fa', bearer(SECRET.reader)), secured);
    await expectError('forbidden', putWith('1', '/v1/objects/elsewhere', bearer(SECRET.writer)), secured);
  });

  test("the forgery guard refuses a token that would raise a fence but is no leader's: 409 unverified_token", async () => {
    await expectError('unverified_token', putWith('5', '/v1/fences/w%2Fguarded%2Ff', bearer(SECRET.writer)), secured);
  });

  test('transaction errors: bad body, too many statements, refused statement, SQL error, permission, conflict, timeout', async () => {
    await expectError('invalid_transaction', { ...tx([]), payload: '{"fences":' }, secured);
    await expectError('too_many_statements', tx(Array.from({ length: 9 }, () => ({ sql: 'SELECT 1' }))), secured);
    await expectError('statement_not_allowed', tx([{ sql: 'COMMIT' }]), secured);
    const syntax = await expectError('sql_error', tx([{ sql: 'SELEC 1' }]), secured);
    expect(syntax.json()).toMatchObject({ sqlState: '42601', statement: 0 });
    await expectError('sql_permission_denied', tx([{ sql: 'SELECT * FROM fencepost.fences' }]), secured);
    await expectError('sql_conflict', tx([{ sql: 'INSERT INTO public.err_t VALUES (1), (1)' }]), secured);
    const unfenced = await expectError('not_fenced', tx([{ sql: 'INSERT INTO public.err_protected VALUES (1)' }]), secured);
    expect(unfenced.json()).toMatchObject({ sqlState: 'FP403', statement: 0 });
    await expectError('sql_timeout', tx([{ sql: 'SELECT pg_sleep(2)' }]), secured);
  });

  test("transaction failures of the proxy's own: result_too_large, transactions_unavailable, commit_unknown", async () => {
    const small = securedApp(db.pool, role, { transactions: { clientRole: clientRoleFor(db.pool), maxResultBytes: 4096 } });
    const noRole = securedApp(db.pool, uniqueRole('missing'), { transactions: { clientRole: clientRoleFor(db.pool) } });
    // The transaction's connection goes through a TCP proxy that lets COMMIT reach Postgres and
    // loses its answer: the proxy cannot know whether it committed.
    const pgUrl = new URL(db.url);
    const net = await TcpProxy.start({ targetHost: pgUrl.hostname, targetPort: Number(pgUrl.port) });
    const viaNet = new URL(db.url);
    viaNet.port = String(net.port);
    await db.pool.query(`CREATE TABLE public.err_commit (id int); GRANT INSERT ON public.err_commit TO ${role}`);
    const lossy = securedApp(db.pool, role, { transactions: { clientRole: clientRoleFor(db.pool), database: viaNet.toString() } });
    try {
      await expectError('result_too_large', tx([{ sql: `SELECT repeat('x', 100000) AS big` }]), small);
      await expectError('transactions_unavailable', tx([{ sql: 'SELECT 1' }]), noRole);
      // The transaction's seal (sql/transactions.ts sealAndCommit), not the session fence's own commit before it.
      const commit = Buffer.from('synchronous_commit = on; COMMIT\0');
      net.loseReplyAfter((chunk) => chunk.includes(commit));
      await expectError('commit_unknown', tx([{ sql: 'INSERT INTO public.err_commit VALUES (1)' }]), lossy);
    } finally {
      await Promise.all([small.close(), noRole.close(), lossy.close()]);
      await net.close();
    }
  });

  test('oversized headers get 431 headers_too_large and a stalled body 408 request_timeout, in the registry shape', async () => {
    const big = await rawHttp(url, [`GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`]);
    expect(big).toMatch(/^HTTP\/1\.1 431 /);
    expect(JSON.parse(big.slice(big.indexOf('\r\n\r\n') + 4)).error).toBe('headers_too_large');
    produced.add('headers_too_large');
    const slow = await rawHttp(url, [
      `PUT /v1/objects/w%2Fslow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${SECRET.writer}\r\nFencing-Token: 1\r\nContent-Length: 10\r\n\r\nab`,
    ]);
    expect(slow).toMatch(/^HTTP\/1\.1 408 /);
    expect(JSON.parse(slow.slice(slow.indexOf('\r\n\r\n') + 4)).error).toBe('request_timeout');
    produced.add('request_timeout');
  });
});

describe('browser errors (test/proxy/http/browser-guard.test.ts has the rest)', () => {
  test('a transaction not sent as JSON gets 415, a foreign Origin 403 forbidden_origin, an open proxy under a foreign name 403 forbidden_host', async () => {
    await expectError('unsupported_media_type', {
      method: 'POST',
      url: '/v1/transactions',
      headers: { 'content-type': 'text/plain' },
      payload: '{}',
    });
    await expectError('forbidden_origin', { ...putWith('1'), headers: { 'fencing-token': '1', origin: 'https://evil.example' } });
    await expectError('forbidden_host', { ...putWith('1'), headers: { 'fencing-token': '1', host: 'evil.example:8080' } });
  });
});

test('a write while a failover could lose a fence raise, a synchronous standby required, gets 503 durability_unsafe and writes nothing', async () => {
  // The test Postgres has no standby: with one required, its empty synchronous_standby_names is the reason.
  const monitor = new DurabilityMonitor(db.pool, { intervalMs: 0, requireSyncStandby: true, logger: null });
  await monitor.check();
  const strict = testApp(db.pool, { durability: monitor });
  try {
    const before = await counts();
    const res = await expectError('durability_unsafe', putWith('1', '/v1/objects/unsafe'), strict);
    expect(res.json()).toMatchObject({ reasons: ['no_sync_standby'] });
    expect(res.headers['retry-after']).toBe('1');
    expect(await counts()).toBe(before);
  } finally {
    await strict.close();
  }
});

test("every registry code except internal is produced above, and the HTTP API doc's error table matches the registry", () => {
  const codes = Object.keys(ERRORS) as ErrorCode[];
  expect(codes.filter((c) => c !== 'internal' && !produced.has(c))).toEqual([]);
  const doc = readFileSync(join(REPO, 'docs', 'http-api.md'), 'utf8');
  const rows = [...doc.matchAll(/^\| `([a-z_]+)` \| (\d{3}) \|/gm)].map((m) => [m[1], Number(m[2])]);
  expect(Object.fromEntries(rows)).toEqual(Object.fromEntries(codes.map((c) => [c, ERRORS[c].status])));
});
