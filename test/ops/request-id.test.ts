// X-Request-Id: on every response (errors included), the client's own when sane, else generated;
// and in the request's log lines (pino's reqId).
import { afterAll, beforeAll, expect, test } from 'vitest';
import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { buildApp } from '../../src/proxy/http/app.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../support/db.ts';

let db: TestDatabase;
let app: FastifyInstance;
const lines: Record<string, unknown>[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString().split('\n')) if (l !== '') lines.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  app = buildApp({
    store: new FenceStore(db.pool, STORE_DEFAULTS),
    bodyLimitBytes: 1024,
    logger: pino({ level: 'info' }, sink),
    transactions: { clientRole: clientRoleFor(db.pool) },
  });
  await app.ready();
});
afterAll(async () => {
  await app.close();
  await db.drop();
});

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

test('every response carries X-Request-Id, errors of every stage included', async () => {
  const requests = [
    { url: '/healthz' }, // success
    { url: '/v1/objects/nothing-here' }, // 404 from the route
    { url: '/no/such/route' }, // 404 from the not-found handler
    { url: '/v1/objects/%zz' }, // bad percent-encoding, before routing
    { method: 'PUT' as const, url: '/v1/objects/k' }, // 428 from the header schema
    { url: '/v1/stats', headers: { origin: 'https://evil.example' } }, // 403 from the browser guard
  ];
  for (const r of requests) {
    const res = await app.inject(r);
    expect(res.headers['x-request-id'], `${r.url} → ${res.statusCode}`).toMatch(UUID);
    const own = await app.inject({ ...r, headers: { ...r.headers, 'x-request-id': 'job-42.attempt_1' } });
    expect(own.headers['x-request-id'], `${r.url} → ${own.statusCode}`).toBe('job-42.attempt_1');
  }
});

test('a client id that is not sane (too long, odd characters, repeated) is replaced by a generated one', async () => {
  for (const id of ['x'.repeat(129), 'a b', 'a\u00e9', '', 'a;b', '../x{}']) {
    const res = await app.inject({ url: '/healthz', headers: { 'x-request-id': id } });
    expect(res.headers['x-request-id'], JSON.stringify(id)).toMatch(UUID);
  }
  expect((await app.inject({ url: '/healthz', headers: { 'x-request-id': 'x'.repeat(128) } })).headers['x-request-id']).toBe(
    'x'.repeat(128),
  );
});

test("the request's log lines carry its id", async () => {
  await app.inject({ method: 'PUT', url: '/v1/objects/logged', headers: { 'fencing-token': '5' }, payload: 'a' });
  await app.inject({
    method: 'PUT',
    url: '/v1/objects/logged',
    headers: { 'fencing-token': '4', 'x-request-id': 'zombie-write-1' },
    payload: 'b',
  });
  const line = lines.find((l) => l.msg === 'stale token rejected' && l.fenceKey === 'logged');
  expect(line).toMatchObject({ reqId: 'zombie-write-1', token: '4' });
});
