// GET /metrics: write counters and latency move with accepted, rejected, invalid and failed writes;
// pool gauges and process metrics are exposed; each app has its own registry.
import { describe, expect } from 'vitest';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { closedPort } from '../../tools/ports.ts';
import { clientRoleFor } from '../support/db.ts';
import { appTest as test } from '../support/fixtures.ts';
import { testApp } from '../support/proxy.ts';
import { DOOR_SERIES, DOORS, WRITE_OPERATIONS, WRITE_OUTCOMES } from '../../src/proxy/metrics.ts';

/** Parses the exposition text into `name{labels}` → value (labels in the order printed). */
async function scrape(target: FastifyInstance): Promise<Map<string, number>> {
  const res = await target.inject({ url: '/metrics' });
  expect(res.statusCode).toBe(200);
  expect(res.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
  const out = new Map<string, number>();
  for (const line of res.body.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** The HTTP door's series; POST /v1/transactions is door "transaction". */
const writes = (m: Map<string, number>, operation: string, outcome: string) =>
  m.get(
    `fencepost_writes_total{door="${operation === 'transaction' ? 'transaction' : 'http'}",operation="${operation}",outcome="${outcome}"}`,
  ) ?? 0;
const latencyCount = (m: Map<string, number>, operation: string, outcome: string) =>
  m.get(`fencepost_write_duration_seconds_count{operation="${operation}",outcome="${outcome}"}`) ?? 0;

const put = (target: FastifyInstance, key: string, token: string) =>
  target.inject({ method: 'PUT', url: `/v1/objects/${key}`, headers: { 'fencing-token': token }, payload: 'x' });

describe('write counters', () => {
  // A counter that first appears at 1 is invisible to increase(): the first rejection after a
  // start (a lone zombie) would fire no alert. So every combination exists at 0 from the start.
  test('every door × operation × outcome it can answer is exposed at 0 before any write', async ({ db }) => {
    const fresh = testApp(db.pool);
    try {
      const m = await scrape(fresh);
      for (const door of DOORS) {
        for (const operation of DOOR_SERIES[door].operations) {
          for (const outcome of DOOR_SERIES[door].outcomes)
            expect(
              m.get(`fencepost_writes_total{door="${door}",operation="${operation}",outcome="${outcome}"}`),
              `${door} ${operation} ${outcome}`,
            ).toBe(0);
        }
        expect(m.get(`fencepost_rejections_total{door="${door}",reason="stale_token"}`), door).toBe(0);
        expect(m.get(`fencepost_rejections_unrecorded_total{door="${door}"}`), door).toBe(0);
      }
      expect(DOORS).toEqual(['http', 'transaction', 'sql']);
      expect(WRITE_OPERATIONS).toEqual(['put', 'delete', 'fence', 'transaction']);
      expect(WRITE_OUTCOMES).toEqual(['accepted', 'rejected', 'precondition_failed', 'invalid', 'rolled_back', 'error']);
    } finally {
      await fresh.close();
    }
  });

  test('a write whose If-Match or If-None-Match fails counts as precondition_failed, neither accepted nor rejected', async ({ app }) => {
    expect((await put(app, 'm-cond', '1')).statusCode).toBe(200);
    const before = await scrape(app);
    const res = await app.inject({
      method: 'PUT',
      url: '/v1/objects/m-cond',
      headers: { 'fencing-token': '1', 'if-none-match': '*' },
      payload: 'x',
    });
    expect(res.statusCode).toBe(412);
    const after = await scrape(app);
    expect(writes(after, 'put', 'precondition_failed') - writes(before, 'put', 'precondition_failed')).toBe(1);
    for (const outcome of ['accepted', 'rejected', 'invalid'])
      expect(writes(after, 'put', outcome), outcome).toBe(writes(before, 'put', outcome));
  });

  test('transactions count under operation "transaction": stale fences as rejected, SQL conflicts as invalid', async ({ app, db }) => {
    await db.pool.query('CREATE TABLE IF NOT EXISTS public.metric_tx (id int PRIMARY KEY)');
    // Open mode: client SQL runs as the client login, with what the operator granted it.
    await app.fence.provision();
    await db.pool.query(`GRANT SELECT, INSERT ON public.metric_tx TO ${clientRoleFor(db.pool)}`);
    const tx = (token: string, sql: string) =>
      app.inject({
        method: 'POST',
        url: '/v1/transactions',
        payload: { fences: [{ key: 'm-tx', token }], statements: [{ sql, params: [] }] },
      });
    const before = await scrape(app);
    expect((await tx('5', 'INSERT INTO public.metric_tx VALUES (1)')).statusCode).toBe(200);
    expect((await tx('4', 'INSERT INTO public.metric_tx VALUES (2)')).json().error).toBe('stale_token');
    const conflict = await tx('5', 'INSERT INTO public.metric_tx VALUES (1)');
    expect(conflict.statusCode).toBe(409);
    expect(conflict.json().error).not.toBe('stale_token');
    const after = await scrape(app);
    expect(writes(after, 'transaction', 'accepted') - writes(before, 'transaction', 'accepted')).toBe(1);
    expect(writes(after, 'transaction', 'rejected') - writes(before, 'transaction', 'rejected')).toBe(1);
    expect(writes(after, 'transaction', 'invalid') - writes(before, 'transaction', 'invalid')).toBe(1);
  });

  test('an accepted put raises accepted and its latency count by one, and nothing else', async ({ app }) => {
    const before = await scrape(app);
    expect((await put(app, 'm-accept', '5')).statusCode).toBe(200);
    const after = await scrape(app);
    expect(writes(after, 'put', 'accepted') - writes(before, 'put', 'accepted')).toBe(1);
    expect(latencyCount(after, 'put', 'accepted') - latencyCount(before, 'put', 'accepted')).toBe(1);
    expect(writes(after, 'put', 'rejected')).toBe(writes(before, 'put', 'rejected'));
    expect(after.get('fencepost_write_duration_seconds_sum{operation="put",outcome="accepted"}')).toBeGreaterThan(0);
  });

  test('stale-token writes count as rejected per operation (put, delete, fence)', async ({ app }) => {
    expect((await put(app, 'm-stale', '10')).statusCode).toBe(200);
    const before = await scrape(app);
    expect((await put(app, 'm-stale', '9')).statusCode).toBe(409);
    expect((await put(app, 'm-stale', '8')).statusCode).toBe(409);
    expect((await app.inject({ method: 'DELETE', url: '/v1/objects/m-stale', headers: { 'fencing-token': '3' } })).statusCode).toBe(409);
    expect((await app.inject({ method: 'PUT', url: '/v1/fences/m-stale', headers: { 'fencing-token': '1' } })).statusCode).toBe(409);
    const after = await scrape(app);
    expect(writes(after, 'put', 'rejected') - writes(before, 'put', 'rejected')).toBe(2);
    expect(writes(after, 'delete', 'rejected') - writes(before, 'delete', 'rejected')).toBe(1);
    expect(writes(after, 'fence', 'rejected') - writes(before, 'fence', 'rejected')).toBe(1);
    expect(latencyCount(after, 'put', 'rejected') - latencyCount(before, 'put', 'rejected')).toBe(2);
    expect(writes(after, 'put', 'accepted')).toBe(writes(before, 'put', 'accepted'));
  });

  test('accepted delete and fence advances count under their own operation', async ({ app }) => {
    const before = await scrape(app);
    expect((await app.inject({ method: 'DELETE', url: '/v1/objects/m-accept', headers: { 'fencing-token': '5' } })).statusCode).toBe(204);
    expect((await app.inject({ method: 'PUT', url: '/v1/fences/m-fence', headers: { 'fencing-token': '2' } })).statusCode).toBe(200);
    const after = await scrape(app);
    expect(writes(after, 'delete', 'accepted') - writes(before, 'delete', 'accepted')).toBe(1);
    expect(writes(after, 'fence', 'accepted') - writes(before, 'fence', 'accepted')).toBe(1);
  });

  test('a write refused for bad input counts as invalid, not rejected', async ({ app }) => {
    const before = await scrape(app);
    expect((await app.inject({ method: 'PUT', url: '/v1/objects/m-bad', payload: 'x' })).statusCode).toBe(428);
    expect((await put(app, 'm-bad', 'abc')).statusCode).toBe(400);
    const after = await scrape(app);
    expect(writes(after, 'put', 'invalid') - writes(before, 'put', 'invalid')).toBe(2);
    expect(writes(after, 'put', 'rejected')).toBe(writes(before, 'put', 'rejected'));
  });

  test('reads are not writes: a GET moves only the HTTP request counter', async ({ app }) => {
    const before = await scrape(app);
    expect((await app.inject({ url: '/v1/objects/m-stale' })).statusCode).toBe(200);
    const after = await scrape(app);
    for (const [name, value] of after) if (name.startsWith('fencepost_writes_total')) expect(value, name).toBe(before.get(name));
    const route = 'fencepost_http_requests_total{method="GET",route="/v1/objects/*",status="200"}';
    expect((after.get(route) ?? 0) - (before.get(route) ?? 0)).toBe(1);
  });

  test('labels never carry a key: the HTTP counter uses the route pattern', async ({ app }) => {
    await put(app, 'm-secret-key-name', '1');
    const res = await app.inject({ url: '/metrics' });
    expect(res.body).not.toContain('m-secret-key-name');
    expect(res.body).toContain('route="/v1/objects/*"');
  });

  test('a write the database cannot take counts as error', async () => {
    const pool = new pg.Pool({
      connectionString: `postgres://nobody:x@127.0.0.1:${await closedPort()}/none`,
      connectionTimeoutMillis: 2000,
    });
    pool.on('error', () => {});
    const down = testApp(pool);
    try {
      expect((await put(down, 'k', '1')).statusCode).toBe(503);
      const m = await scrape(down);
      expect(writes(m, 'put', 'error')).toBe(1);
      expect(writes(m, 'put', 'accepted')).toBe(0);
    } finally {
      await down.close();
      await pool.end();
    }
  });
});

describe('registries, pool and process', () => {
  test('each app counts only its own writes', async ({ app, db }) => {
    const other = testApp(db.pool);
    try {
      const before = await scrape(other);
      await put(app, 'm-own', '1');
      const after = await scrape(other);
      expect(writes(after, 'put', 'accepted')).toBe(writes(before, 'put', 'accepted'));
      expect(writes(after, 'put', 'accepted')).toBe(0);
    } finally {
      await other.close();
    }
  });

  test('pool gauges report the pool: connections open after a write, none waiting, the size limit', async ({ app, db }) => {
    await put(app, 'm-pool', '1');
    const m = await scrape(app);
    expect(m.get('fencepost_db_pool_connections')).toBeGreaterThanOrEqual(1);
    expect(m.get('fencepost_db_pool_connections')).toBe(db.pool.totalCount);
    expect(m.get('fencepost_db_pool_idle_connections')).toBe(db.pool.idleCount);
    expect(m.get('fencepost_db_pool_waiting_requests')).toBe(0);
    expect(m.get('fencepost_db_pool_max_connections')).toBe(10);
  });

  test('pool waiting requests rise while every connection is taken', async ({ db }) => {
    const small = new pg.Pool({ connectionString: db.url, max: 1 });
    const busy = testApp(small);
    const held = await small.connect();
    try {
      const pending = put(busy, 'm-wait', '1');
      await expect.poll(async () => (await scrape(busy)).get('fencepost_db_pool_waiting_requests'), { timeout: 5000 }).toBe(1);
      held.release();
      expect((await pending).statusCode).toBe(200);
      expect((await scrape(busy)).get('fencepost_db_pool_waiting_requests')).toBe(0);
    } finally {
      await busy.close();
      await small.end();
    }
  });

  test('process metrics are exposed next to the app metrics', async ({ app }) => {
    const m = await scrape(app);
    expect(m.get('process_cpu_user_seconds_total')).toBeGreaterThan(0);
    expect(m.get('process_resident_memory_bytes')).toBeGreaterThan(0);
    expect(m.has('nodejs_eventloop_lag_seconds')).toBe(true);
    expect([...m.keys()].some((k) => k.startsWith('nodejs_heap_size_used_bytes'))).toBe(true);
  });
});
