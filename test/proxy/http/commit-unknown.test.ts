// An answer says what happened: a write whose statement reached Postgres but whose answer was lost
// (the connection cut right after it went through) may have committed, so it answers 503
// `commit_unknown` ("read back before retrying"), never `unavailable` ("safe to retry"). A write
// that could not reach the database at all stays `unavailable`. Real Postgres behind a TCP proxy
// that loses the reply (tools/faults/tcp-proxy.ts).
import { afterAll, beforeAll, expect, test } from 'vitest';
import pg from 'pg';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { testApp } from '../../support/proxy.ts';
import { TcpProxy } from '../../../tools/faults/tcp-proxy.ts';

let db: TestDatabase;
let net: TcpProxy;
let pool: pg.Pool;
let app: FastifyInstance;

beforeAll(async () => {
  db = await createTestDatabase();
  const target = new URL(db.url);
  net = await TcpProxy.start({ targetHost: target.hostname, targetPort: Number(target.port) });
  const via = new URL(db.url);
  via.port = String(net.port);
  pool = new pg.Pool({ connectionString: via.toString(), max: 4 });
  pool.on('error', () => {});
  app = testApp(pool);
  await app.ready();
});

afterAll(async () => {
  await app?.close();
  await pool?.end();
  await net?.close();
  await db?.drop();
});

test('a PUT whose statement went through and whose answer was lost answers 503 commit_unknown; reading back shows it committed', async () => {
  net.loseReplyAfter((chunk) => chunk.includes(Buffer.from('fencepost.objects')) || chunk.includes(Buffer.from('fencepost_fenced')));
  const res = await app.inject({
    method: 'PUT',
    url: '/v1/objects/cu%2F1',
    headers: { 'fencing-token': '1', 'fence-key': 'cu' },
    payload: 'maybe',
  });
  expect(res.statusCode, res.body).toBe(503);
  expect(res.json()).toMatchObject({ error: 'commit_unknown', message: expect.stringContaining('read back before retrying') });
  const { rows } = await db.pool.query("SELECT convert_from(body, 'UTF8') AS body FROM fencepost.objects WHERE key = $1", ['cu/1']);
  expect(rows).toEqual([{ body: 'maybe' }]);
});

test('a write that cannot reach the database answers 503 unavailable, safe to retry', async () => {
  net.refuse();
  try {
    await pool.query('SELECT 1').catch(() => {}); // drop the pooled connections' chance to be reused
    const fresh = new pg.Pool({
      connectionString: (() => {
        const u = new URL(db.url);
        u.port = String(net.port);
        return u.toString();
      })(),
      max: 1,
      connectionTimeoutMillis: 2000,
    });
    fresh.on('error', () => {});
    const cold = testApp(fresh);
    try {
      await cold.ready();
      const res = await cold.inject({
        method: 'PUT',
        url: '/v1/objects/cu%2F2',
        headers: { 'fencing-token': '1', 'fence-key': 'cu' },
        payload: 'no',
      });
      expect(res.statusCode, res.body).toBe(503);
      expect(res.json().error).toBe('unavailable');
    } finally {
      await cold.close();
      await fresh.end();
    }
  } finally {
    net.forward();
  }
});
