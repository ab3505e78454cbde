// GET /v1/rejections and /v1/rejections/histogram, and the rejection log's bounded retention.
import { portRangeEnv } from '../../tools/ports.ts';
import { describe, expect } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { ERRORS } from '../../src/proxy/errors.ts';
import { ConfigError, loadConfig } from '../../src/proxy/config.ts';
import { startProxy } from '../../src/proxy/server.ts';
import { RejectionPruner, RETENTION_LOCK_KEY } from '../../src/fence/retention.ts';
import type { TestDatabase } from '../support/db.ts';
import { appTest as test } from '../support/fixtures.ts';

interface RejectionJson {
  id: string;
  fenceKey: string;
  objectKey: string | null;
  operation: string;
  door: string;
  token: string;
  highestToken: string;
  writerId: string | null;
  rejectedAt: string;
}

const write = (app: FastifyInstance, url: string, token: string, headers: Record<string, string> = {}, method: 'PUT' | 'DELETE' = 'PUT') =>
  app.inject({ method, url, headers: { 'fencing-token': token, ...headers }, payload: method === 'PUT' ? 'x' : undefined });

async function rejections(app: FastifyInstance, query: string): Promise<{ rejections: RejectionJson[]; next: string | null }> {
  const res = await app.inject({ url: `/v1/rejections${query}` });
  expect(res.statusCode, res.body).toBe(200);
  return res.json();
}

/** Fills a fresh fence key with `n` rejections with tokens 1…n (newest = highest token). */
async function rejectMany(app: FastifyInstance, fenceKey: string, n: number): Promise<void> {
  expect((await write(app, `/v1/fences/${fenceKey}`, '1000')).statusCode).toBe(200);
  for (let i = 1; i <= n; i++)
    expect((await write(app, `/v1/objects/${fenceKey}-obj`, String(i), { 'fence-key': fenceKey })).statusCode).toBe(409);
}

async function rowCount(db: TestDatabase): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM fencepost.rejections');
  return rows[0]!.n;
}

describe('GET /v1/rejections', () => {
  test('a rejected write appears with every field, tokens as strings', async ({ app }) => {
    expect((await write(app, '/v1/objects/orders%2F7', '42')).statusCode).toBe(200);
    expect((await write(app, '/v1/objects/orders%2F7', '41', { 'writer-id': 'zombie-a' })).statusCode).toBe(409);
    expect((await write(app, '/v1/fences/orders%2F7', '40')).statusCode).toBe(409);
    expect((await write(app, '/v1/objects/orders%2F7', '39', {}, 'DELETE')).statusCode).toBe(409);
    const page = await rejections(app, '?fenceKey=orders%2F7');
    expect(page.next).toBeNull();
    expect(page.rejections.map(({ id: _id, rejectedAt: _at, ...r }) => r)).toEqual([
      { fenceKey: 'orders/7', objectKey: 'orders/7', operation: 'delete', door: 'http', token: '39', highestToken: '42', writerId: null },
      { fenceKey: 'orders/7', objectKey: null, operation: 'fence', door: 'http', token: '40', highestToken: '42', writerId: null },
      {
        fenceKey: 'orders/7',
        objectKey: 'orders/7',
        operation: 'put',
        door: 'http',
        token: '41',
        highestToken: '42',
        writerId: 'zombie-a',
      },
    ]);
    const at = Date.parse(page.rejections[0]!.rejectedAt);
    expect(Math.abs(Date.now() - at)).toBeLessThan(60_000);
  });

  test('pages newest first: following next as before visits every rejection once, in order', async ({ app }) => {
    await rejectMany(app, 'paging', 23);
    const seen: RejectionJson[] = [];
    let before: string | null = null;
    let pages = 0;
    do {
      const page = await rejections(app, `?fenceKey=paging&limit=5${before === null ? '' : `&before=${before}`}`);
      expect(page.rejections.length).toBeLessThanOrEqual(5);
      seen.push(...page.rejections);
      before = page.next;
      pages++;
    } while (before !== null);
    expect(pages).toBe(5);
    expect(seen.map((r) => r.token)).toEqual(Array.from({ length: 23 }, (_, i) => String(23 - i)));
    const ids = seen.map((r) => BigInt(r.id));
    expect(ids.every((id, i) => i === 0 || id < ids[i - 1]!)).toBe(true);
  });

  test('the last full page says next = null when nothing older remains', async ({ app }) => {
    await rejectMany(app, 'exact', 4);
    const first = await rejections(app, '?fenceKey=exact&limit=4');
    expect(first.rejections).toHaveLength(4);
    expect(first.next).toBeNull();
    const short = await rejections(app, '?fenceKey=exact&limit=3');
    expect(short.next).toBe(short.rejections[2]!.id);
  });

  test('without fenceKey it lists every fence key, newest first; fenceKey filters to one', async ({ app }) => {
    await rejectMany(app, 'mix-a', 2);
    await rejectMany(app, 'mix-b', 2);
    const all = await rejections(app, '?limit=4');
    expect(all.rejections.map((r) => `${r.fenceKey}:${r.token}`)).toEqual(['mix-b:2', 'mix-b:1', 'mix-a:2', 'mix-a:1']);
    const onlyA = await rejections(app, '?fenceKey=mix-a');
    expect(onlyA.rejections.map((r) => r.fenceKey)).toEqual(['mix-a', 'mix-a']);
    expect((await rejections(app, '?fenceKey=never-seen')).rejections).toEqual([]);
  });

  test('limit defaults to 100', async ({ app }) => {
    await rejectMany(app, 'many', 105);
    const page = await rejections(app, '?fenceKey=many');
    expect(page.rejections).toHaveLength(100);
    expect(page.next).not.toBeNull();
  });

  test.for([
    ['limit=0', 'invalid_query'],
    ['limit=1001', 'invalid_query'],
    ['limit=abc', 'invalid_query'],
    ['limit=1&limit=2', 'invalid_query'],
    ['before=abc', 'invalid_query'],
    ['before=0', 'invalid_query'],
    ['before=-5', 'invalid_query'],
    ['before=9223372036854775808', 'invalid_query'],
    ['fenceKey=a&fenceKey=b', 'invalid_query'],
    ['fenceKey=', 'invalid_key'],
    ['fenceKey=a%00b', 'invalid_key'],
  ] as const)('?%s is refused with %s', async ([query, code], { app }) => {
    const res = await app.inject({ url: `/v1/rejections?${query}` });
    expect(res.statusCode).toBe(ERRORS[code].status);
    expect(res.json()).toMatchObject({ error: code, message: expect.any(String) });
  });
});

describe('GET /v1/rejections/histogram', () => {
  test('counts rejections per minute, oldest bucket first, the current minute last, empty minutes as 0', async ({ app, db }) => {
    await rejectMany(app, 'hist', 3);
    // Move one of them 5 minutes back: it must land in the bucket of its minute.
    const moved = await db.pool.query<{ minute: Date }>(
      `UPDATE fencepost.rejections SET rejected_at = date_trunc('minute', now()) - interval '5 minutes' + interval '10 seconds'
       WHERE id = (SELECT min(id) FROM fencepost.rejections WHERE fence_key = 'hist')
       RETURNING date_trunc('minute', rejected_at) AS minute`,
    );
    const movedMinute = moved.rows[0]!.minute.toISOString();
    const res = await app.inject({ url: '/v1/rejections/histogram?minutes=10&fenceKey=hist' });
    expect(res.statusCode).toBe(200);
    const body = res.json() as { bucketSeconds: number; fenceKey: string; buckets: { start: string; count: number }[] };
    expect(body.bucketSeconds).toBe(60);
    expect(body.buckets).toHaveLength(10);
    const counts = body.buckets.map((b) => b.count);
    // The write may straddle a minute boundary; the total and the moved row are exact.
    expect(counts.reduce((a, b) => a + b, 0)).toBe(3);
    const at = body.buckets.findIndex((b) => b.start === movedMinute);
    expect(at).toBeGreaterThanOrEqual(3); // 4 if the minute did not turn during the test
    expect(body.buckets[at]!.count).toBe(1);
    expect(counts.slice(0, at).every((c) => c === 0)).toBe(true);
    const starts = body.buckets.map((b) => Date.parse(b.start));
    expect(starts.every((s, i) => i === 0 || s - starts[i - 1]! === 60_000)).toBe(true);
  });

  test('without fenceKey it counts every fence key', async ({ app, db }) => {
    const one = (await (await app.inject({ url: '/v1/rejections/histogram?minutes=1440' })).json()) as { buckets: { count: number }[] };
    expect(one.buckets).toHaveLength(1440);
    expect(one.buckets.reduce((a, b) => a + b.count, 0)).toBe(await rowCount(db));
  });

  test.for(['minutes=0', 'minutes=1441', 'minutes=x', 'minutes=1.5'])('?%s is refused with invalid_query', async (query, { app }) => {
    const res = await app.inject({ url: `/v1/rejections/histogram?${query}` });
    expect(res.statusCode).toBe(400);
    expect(res.json().error).toBe('invalid_query');
  });
});

describe('retention', () => {
  async function fenceRows(db: TestDatabase): Promise<string> {
    const { rows } = await db.pool.query(
      'SELECT fence_key, highest_token, accepted, rejected FROM fencepost.fence_stats ORDER BY fence_key',
    );
    return JSON.stringify(rows);
  }

  test('max rows keeps the newest rows, deleting in batches; fence rows and counts are untouched', async ({ app, db }) => {
    await rejectMany(app, 'ret-rows', 30);
    const fencesBefore = await fenceRows(db);
    const newest = (await rejections(app, '?limit=12')).rejections.map((r) => r.id);
    let pruned = 0;
    const pruner = new RejectionPruner(db.pool, {
      maxAgeMs: 0,
      maxRows: 12,
      intervalMs: 60_000,
      batchSize: 7,
      onPruned: (n) => (pruned += n),
    });
    const total = await rowCount(db);
    expect(await pruner.pruneOnce()).toEqual({ ran: true, deleted: total - 12 });
    expect(pruned).toBe(total - 12);
    expect(await rowCount(db)).toBe(12);
    expect((await rejections(app, '?limit=100')).rejections.map((r) => r.id)).toEqual(newest);
    expect(await fenceRows(db)).toBe(fencesBefore);
    // The rejected counts (on the fence rows) survive pruning of the log.
    const stats = (await app.inject({ url: '/v1/stats' })).json() as { rejected: number };
    expect(stats.rejected).toBeGreaterThan(12);
    // Nothing more to do.
    expect(await pruner.pruneOnce()).toEqual({ ran: true, deleted: 0 });
  });

  test('max age deletes rows older than the limit and keeps younger ones', async ({ app, db }) => {
    await rejectMany(app, 'ret-age', 6);
    await db.pool.query(
      `UPDATE fencepost.rejections SET rejected_at = now() - interval '2 hours'
       WHERE id IN (SELECT id FROM fencepost.rejections WHERE fence_key = 'ret-age' ORDER BY id LIMIT 4)`,
    );
    const total = await rowCount(db);
    const pruner = new RejectionPruner(db.pool, { maxAgeMs: 3600_000, maxRows: 0, intervalMs: 60_000, batchSize: 3 });
    expect(await pruner.pruneOnce()).toEqual({ ran: true, deleted: 4 });
    expect(await rowCount(db)).toBe(total - 4);
    expect((await rejections(app, '?fenceKey=ret-age')).rejections.map((r) => r.token)).toEqual(['6', '5']);
  });

  test('one instance at a time: a round is skipped while another session holds the retention lock', async ({ app, db }) => {
    await rejectMany(app, 'ret-lock', 3);
    const other = await db.pool.connect();
    try {
      await other.query('SELECT pg_advisory_lock($1)', [RETENTION_LOCK_KEY.toString()]);
      const pruner = new RejectionPruner(db.pool, { maxAgeMs: 0, maxRows: 1, intervalMs: 60_000 });
      const before = await rowCount(db);
      expect(await pruner.pruneOnce()).toEqual({ ran: false, reason: 'locked' });
      expect(await rowCount(db)).toBe(before);
      await other.query('SELECT pg_advisory_unlock($1)', [RETENTION_LOCK_KEY.toString()]);
      expect(await pruner.pruneOnce()).toMatchObject({ ran: true });
      expect(await rowCount(db)).toBe(1);
    } finally {
      other.release();
    }
  });

  test('concurrent pruners on one database delete each row once and leave exactly the limit', async ({ app, db }) => {
    await rejectMany(app, 'ret-race', 40);
    const pruners = Array.from(
      { length: 4 },
      () => new RejectionPruner(db.pool, { maxAgeMs: 0, maxRows: 5, intervalMs: 60_000, batchSize: 4 }),
    );
    const before = await rowCount(db);
    const results = await Promise.all(pruners.map((p) => p.pruneOnce()));
    const deleted = results.reduce((s, r) => s + (r.ran ? r.deleted : 0), 0);
    expect(deleted).toBe(before - 5);
    expect(await rowCount(db)).toBe(5);
  });

  test('startProxy runs the pruner on its interval and stops it on close', async ({ app, db }) => {
    await rejectMany(app, 'ret-server', 10);
    const config = loadConfig({
      DATABASE_URL: db.url,
      PORT: '0',
      FENCEPOST_LOG_LEVEL: 'silent',
      FENCEPOST_REJECTIONS_MAX_ROWS: '3',
      FENCEPOST_REJECTIONS_PRUNE_INTERVAL_MS: '100',
      ...portRangeEnv(),
    });
    const proxy = await startProxy(config);
    try {
      await expect.poll(() => rowCount(db), { timeout: 10_000 }).toBe(3);
      // New rejections through the running proxy are pruned on a later round.
      for (let i = 0; i < 4; i++) {
        const res = await fetch(`${proxy.url}/v1/objects/ret-server-obj`, {
          method: 'PUT',
          headers: { 'fencing-token': '1', 'fence-key': 'ret-server' },
          body: 'x',
        });
        expect(res.status).toBe(409);
      }
      await expect.poll(() => rowCount(db), { timeout: 10_000 }).toBe(3);
      const metrics = await (await fetch(`${proxy.url}/metrics`)).text();
      expect(Number(/^fencepost_rejection_log_pruned_total (\d+)/m.exec(metrics)?.[1])).toBeGreaterThanOrEqual(4);
      expect(Number(/^fencepost_write_batch_size_count (\d+)/m.exec(metrics)?.[1])).toBeGreaterThanOrEqual(4);
    } finally {
      await proxy.close();
    }
    // Stopped: rows added now stay.
    await rejectMany(app, 'ret-after-close', 3);
    await new Promise((r) => setTimeout(r, 400));
    expect(await rowCount(db)).toBe(6);
  });
});

describe('retention configuration', () => {
  test('defaults: 7 days, 1,000,000 rows, every minute', () => {
    const c = loadConfig({});
    expect([c.rejectionsMaxAgeMs, c.rejectionsMaxRows, c.rejectionsPruneIntervalMs]).toEqual([604_800_000, 1_000_000, 60_000]);
  });

  test.each([
    [{ FENCEPOST_REJECTIONS_MAX_AGE_MS: '1h' }, 'FENCEPOST_REJECTIONS_MAX_AGE_MS'],
    [{ FENCEPOST_REJECTIONS_MAX_ROWS: '-1' }, 'FENCEPOST_REJECTIONS_MAX_ROWS'],
    [{ FENCEPOST_REJECTIONS_PRUNE_INTERVAL_MS: '10' }, 'FENCEPOST_REJECTIONS_PRUNE_INTERVAL_MS'],
    [{ FENCEPOST_REJECTIONS_MAX_AGE_MS: '0', FENCEPOST_REJECTIONS_MAX_ROWS: '0' }, 'FENCEPOST_REJECTIONS_MAX_ROWS'],
  ])('%j fails naming %s', (env, variable) => {
    expect(() => loadConfig(env)).toThrow(ConfigError);
    expect(() => loadConfig(env)).toThrow(variable);
  });

  test('either limit alone may be switched off with 0', () => {
    expect(loadConfig({ FENCEPOST_REJECTIONS_MAX_AGE_MS: '0' }).rejectionsMaxRows).toBe(1_000_000);
    expect(loadConfig({ FENCEPOST_REJECTIONS_MAX_ROWS: '0' }).rejectionsMaxAgeMs).toBe(604_800_000);
  });
});
