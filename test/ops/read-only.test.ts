// A proxy that reaches a database taking no writes (a standby, or a primary still promoting):
// every write answers 503 `unavailable` (nothing committed, safe to retry), never 500, and
// /readyz answers 503 so a load balancer sends writers elsewhere. Real streaming replication.
import { afterAll, beforeAll, expect, test } from 'vitest';
import pg from 'pg';
import type { FastifyInstance } from 'fastify';
import { startReplicatedPostgres, type ReplicatedPostgres } from '../support/replication.ts';
import { testApp } from '../support/proxy.ts';
import { migrate } from '../../src/fence/migrate.ts';

let repl: ReplicatedPostgres;
let standbyPool: pg.Pool;
let app: FastifyInstance;

beforeAll(async () => {
  repl = await startReplicatedPostgres('fp_read_only');
  const primary = new pg.Pool({ connectionString: repl.url, max: 2 });
  try {
    await migrate(primary);
  } finally {
    await primary.end();
  }
  standbyPool = new pg.Pool({ connectionString: repl.standbyUrl, max: 4 });
  standbyPool.on('error', () => {});
  // The standby has replayed the migrations once it shows the definitions.
  for (let i = 0; !(await standbyPool.query(`SELECT to_regclass('fencepost.definitions') IS NOT NULL AS ok`)).rows[0].ok; i++) {
    if (i > 200) throw new Error('the standby did not replay the migrations');
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  app = testApp(standbyPool);
  await app.ready();
}, 120_000);

afterAll(async () => {
  await app?.close();
  await standbyPool?.end();
  await repl?.stop();
});

test('a write through a proxy on a standby answers 503 unavailable, safe to retry, not 500', async () => {
  const put = await app.inject({
    method: 'PUT',
    url: '/v1/objects/ro%2F1',
    headers: { 'fencing-token': '1', 'fence-key': 'ro' },
    payload: 'x',
  });
  expect(put.statusCode, put.body).toBe(503);
  expect(put.json()).toMatchObject({ error: 'unavailable', message: expect.stringContaining('read-only') });
  expect(put.headers['retry-after']).toBe('1');
  const fence = await app.inject({ method: 'PUT', url: '/v1/fences/ro', headers: { 'fencing-token': '1' } });
  expect(fence.statusCode, fence.body).toBe(503);
});

test('/readyz answers 503 while the database is in recovery', async () => {
  const res = await app.inject({ url: '/readyz' });
  expect(res.statusCode).toBe(503);
  expect(res.json()).toMatchObject({ error: 'unavailable', message: expect.stringContaining('recovery') });
});
