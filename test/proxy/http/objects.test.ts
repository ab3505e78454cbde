// The fence rule and every endpoint, through app.inject() against a real Postgres.
import { describe, expect } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase } from '../../support/db.ts';
import { appTest as test } from '../../support/fixtures.ts';
import { testApp } from '../../support/proxy.ts';

let n = 0;
const uniq = (p: string) => `${p}-${++n}`;

const put = (app: FastifyInstance, key: string, token: string | null, body = 'x', headers: Record<string, string> = {}) =>
  app.inject({
    method: 'PUT',
    url: `/v1/objects/${encodeURIComponent(key)}`,
    headers: { 'content-type': 'text/plain', ...(token === null ? {} : { 'fencing-token': token }), ...headers },
    payload: body,
  });
const get = (app: FastifyInstance, key: string) => app.inject({ method: 'GET', url: `/v1/objects/${encodeURIComponent(key)}` });
const del = (app: FastifyInstance, key: string, token: string, headers: Record<string, string> = {}) =>
  app.inject({ method: 'DELETE', url: `/v1/objects/${encodeURIComponent(key)}`, headers: { 'fencing-token': token, ...headers } });
const advance = (app: FastifyInstance, fenceKey: string, token: string) =>
  app.inject({ method: 'PUT', url: `/v1/fences/${encodeURIComponent(fenceKey)}`, headers: { 'fencing-token': token } });

describe('PUT /v1/objects/:key', () => {
  test('accepts the first write to a key and reports version 1', async ({ app }) => {
    const key = uniq('first');
    const res = await put(app, key, '5', 'hello');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ key, fenceKey: key, token: '5', version: 1, etag: expect.stringMatching(/^"[0-9]+\.1"$/) });
    expect(res.headers.etag).toBe(res.json().etag);
  });

  test('accepts an equal token again and counts versions', async ({ app }) => {
    const key = uniq('equal');
    expect((await put(app, key, '7', 'a')).json().version).toBe(1);
    expect((await put(app, key, '7', 'b')).json().version).toBe(2);
    expect((await put(app, key, '8', 'c')).json().version).toBe(3);
    expect((await get(app, key)).body).toBe('c');
  });

  test('rejects a write whose token is below the fence with 409 and leaves the data unchanged', async ({ app }) => {
    const key = uniq('stale');
    await put(app, key, '42', 'leader');
    const res = await put(app, key, '41', 'zombie');
    expect(res.statusCode).toBe(409);
    expect(res.json()).toMatchObject({ error: 'stale_token', fenceKey: key, token: '41', highestToken: '42' });
    const read = await get(app, key);
    expect(read.body).toBe('leader');
    expect(read.headers['fencing-token']).toBe('42');
  });

  test('accepts a ZooKeeper-style zero-padded token as its number', async ({ app }) => {
    const key = uniq('zk');
    expect((await put(app, key, '0000000042')).json().token).toBe('42');
    expect((await put(app, key, '0000000041')).statusCode).toBe(409);
  });

  test('round-trips tokens above 2^53 exactly', async ({ app }) => {
    const key = uniq('big');
    const big = '9223372036854775807';
    expect((await put(app, key, '9007199254740993')).json().token).toBe('9007199254740993');
    expect((await put(app, key, '9007199254740992')).statusCode).toBe(409); // 2^53, one below: distinct only in bigint
    expect((await put(app, key, big)).json().token).toBe(big);
    expect((await get(app, key)).headers['fencing-token']).toBe(big);
    expect((await app.inject({ url: `/v1/fences/${key}` })).json().highestToken).toBe(big);
  });

  test('uses the Fence-Key header so one fence guards many objects', async ({ app }) => {
    const fence = uniq('shared-fence');
    const a = uniq('obj-a');
    const b = uniq('obj-b');
    expect((await put(app, a, '10', 'a', { 'fence-key': fence })).json()).toMatchObject({ fenceKey: fence });
    expect((await put(app, b, '9', 'b', { 'fence-key': fence })).statusCode).toBe(409);
    expect((await get(app, b)).statusCode).toBe(404);
  });

  test('stores and returns the body byte for byte with its content type', async ({ app }) => {
    const key = uniq('bytes');
    const body = Buffer.from([0, 1, 2, 255, 254, 10, 13]);
    const res = await app.inject({
      method: 'PUT',
      url: `/v1/objects/${key}`,
      headers: { 'fencing-token': '1', 'content-type': 'application/x-thing' },
      payload: body,
    });
    expect(res.statusCode).toBe(200);
    const read = await get(app, key);
    expect(read.rawPayload.equals(body)).toBe(true);
    expect(read.headers['content-type']).toBe('application/x-thing');
  });

  test('stores an empty body and a JSON body raw', async ({ app }) => {
    const key = uniq('empty');
    expect((await app.inject({ method: 'PUT', url: `/v1/objects/${key}`, headers: { 'fencing-token': '1' } })).statusCode).toBe(200);
    const read = await get(app, key);
    expect(read.body).toBe('');
    expect(read.headers['content-type']).toBe('application/octet-stream');
    const j = uniq('json');
    const raw = '{ "a" :1 }';
    await put(app, j, '1', raw, { 'content-type': 'application/json' });
    expect((await get(app, j)).body).toBe(raw);
  });

  test('accepts keys with slashes, spaces and non-ASCII when percent-encoded', async ({ app }) => {
    const key = `orders/2026 11/ünïcødé-${++n}`;
    expect((await put(app, key, '3', 'v')).json().key).toBe(key);
    expect((await get(app, key)).body).toBe('v');
  });
});

describe('GET /v1/objects/:key', () => {
  test('answers 404 not_found for a missing key', async ({ app }) => {
    const res = await get(app, uniq('missing'));
    expect(res.statusCode).toBe(404);
    expect(res.json().error).toBe('not_found');
  });

  test('gives an ETag that changes with the content', async ({ app }) => {
    const key = uniq('etag');
    await put(app, key, '1', 'one');
    const e1 = (await get(app, key)).headers.etag;
    await put(app, key, '1', 'two');
    const e2 = (await get(app, key)).headers.etag;
    expect(e1).toMatch(/^".+"$/);
    expect(e2).not.toBe(e1);
  });
});

describe('DELETE /v1/objects/:key', () => {
  test('deletes with a current token and answers 204', async ({ app }) => {
    const key = uniq('del');
    await put(app, key, '4');
    expect((await del(app, key, '4')).statusCode).toBe(204);
    expect((await get(app, key)).statusCode).toBe(404);
  });

  test('rejects a stale delete and keeps the object', async ({ app }) => {
    const key = uniq('del-stale');
    await put(app, key, '4', 'keep');
    const res = await del(app, key, '3');
    expect(res.statusCode).toBe(409);
    expect(res.json().error).toBe('stale_token');
    expect((await get(app, key)).body).toBe('keep');
  });

  test('a delete of a missing key with a valid token answers 204 and still advances the fence', async ({ app }) => {
    const key = uniq('del-missing');
    expect((await del(app, key, '12')).statusCode).toBe(204);
    expect((await put(app, key, '11')).statusCode).toBe(409);
    expect((await app.inject({ url: `/v1/fences/${key}` })).json().highestToken).toBe('12');
  });
});

describe('fences', () => {
  test('PUT /v1/fences/:fenceKey advances the fence and locks out lower tokens on every key of that fence', async ({ app }) => {
    const fence = uniq('lock');
    const res = await advance(app, fence, '20');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ fenceKey: fence, highestToken: '20' });
    expect((await put(app, uniq('never-written'), '19', 'z', { 'fence-key': fence })).statusCode).toBe(409);
    expect((await advance(app, fence, '19')).statusCode).toBe(409);
    expect((await advance(app, fence, '20')).statusCode).toBe(200);
  });

  test('GET /v1/fences/:fenceKey shows the highest token and the counts; 404 if never seen', async ({ app }) => {
    const fence = uniq('show');
    expect((await app.inject({ url: `/v1/fences/${fence}` })).statusCode).toBe(404);
    await put(app, fence, '5');
    await put(app, fence, '6');
    await put(app, fence, '4');
    const f = (await app.inject({ url: `/v1/fences/${fence}` })).json();
    expect(f).toMatchObject({ fenceKey: fence, highestToken: '6', accepted: 2, rejected: 1 });
    expect(new Date(f.updatedAt).getTime()).not.toBeNaN();
  });

  test('GET /v1/fences pages through every fence exactly once', async ({ app }) => {
    const prefix = uniq('page');
    const keys = Array.from({ length: 7 }, (_, i) => `${prefix}-${i}`);
    for (const k of keys) await advance(app, k, '1');
    const seen: string[] = [];
    let after: string | null = null;
    for (let pages = 0; pages < 1000; pages++) {
      const url: string = `/v1/fences?limit=3${after === null ? '' : `&after=${encodeURIComponent(after)}`}`;
      const body = (await app.inject({ url })).json() as { fences: { fenceKey: string }[]; next: string | null };
      expect(body.fences.length).toBeLessThanOrEqual(3);
      seen.push(...body.fences.map((f) => f.fenceKey));
      if (body.next === null) break;
      after = body.next;
    }
    expect(new Set(seen).size).toBe(seen.length);
    expect(seen.filter((k) => k.startsWith(prefix)).sort()).toEqual([...keys].sort());
  });
});

describe('GET /v1/stats', () => {
  test('counts accepted and rejected writes overall and per fence key', async ({ app }) => {
    const before = (await app.inject({ url: '/v1/stats' })).json();
    const fence = uniq('stats');
    await put(app, fence, '2');
    await put(app, fence, '1');
    await put(app, fence, '1');
    await del(app, fence, '3');
    const after = (await app.inject({ url: '/v1/stats?limit=1000' })).json();
    expect(after.accepted - before.accepted).toBe(2);
    expect(after.rejected - before.rejected).toBe(2);
    expect(after.byFenceKey.find((f: { fenceKey: string }) => f.fenceKey === fence)).toEqual({
      fenceKey: fence,
      highestToken: '3',
      raisedBy: null,
      raisedAt: expect.any(String),
      accepted: 2,
      rejected: 2,
    });
  });

  test('logs each rejection with fence key, object key, tokens and writer id', async ({ app, db }) => {
    const fence = uniq('log');
    await put(app, 'obj-' + fence, '9', 'v', { 'fence-key': fence });
    await put(app, 'obj-' + fence, '8', 'v', { 'fence-key': fence, 'writer-id': 'replica-b' });
    const { rows } = await db.pool.query(
      'SELECT fence_key, object_key, operation, token, highest_token, writer_id FROM fencepost.rejections WHERE fence_key = $1',
      [fence],
    );
    expect(rows).toEqual([
      { fence_key: fence, object_key: 'obj-' + fence, operation: 'put', token: '8', highest_token: '9', writer_id: 'replica-b' },
    ]);
  });
});

describe('health', () => {
  test('/healthz and /readyz answer 200 with a migrated database', async ({ app }) => {
    expect((await app.inject({ url: '/healthz' })).statusCode).toBe(200);
    expect((await app.inject({ url: '/readyz' })).statusCode).toBe(200);
  });

  test('/readyz answers 503 on a database without migrations', async () => {
    const bare = await createTestDatabase({ migrate: false });
    const other = testApp(bare.pool);
    try {
      const res = await other.inject({ url: '/readyz' });
      expect(res.statusCode).toBe(503);
      expect(res.json().error).toBe('unavailable');
    } finally {
      await other.close();
      await bare.drop();
    }
  });
});

describe("an object's own token", () => {
  test('a write naming another fence key cannot overwrite an object with a lower token', async ({ app }) => {
    const key = uniq('guarded-object');
    const fence = uniq('owner-fence');
    expect((await put(app, key, '10', 'owner', { 'fence-key': fence })).statusCode).toBe(200);
    // A zombie of the owner's election, sending no Fence-Key (so its fence key is the object key,
    // never raised) or naming a fence it holds, with a token below the object's.
    for (const headers of [{}, { 'fence-key': uniq('other-fence') }] as Record<string, string>[]) {
      const res = await put(app, key, '1', 'zombie', headers);
      expect(res.statusCode).toBe(409);
      expect(res.json()).toMatchObject({ error: 'stale_token', fenceKey: fence, token: '1', highestToken: '10' });
    }
    const del = await app.inject({ method: 'DELETE', url: `/v1/objects/${key}`, headers: { 'fencing-token': '2' } });
    expect(del.statusCode).toBe(409);
    const read = await get(app, key);
    expect(read.body).toBe('owner');
    expect(read.headers['fencing-token']).toBe('10');
    // Refusals are counted as rejections, not acceptances, on the fence they named.
    expect((await app.inject({ url: `/v1/fences/${encodeURIComponent(key)}` })).json()).toMatchObject({ accepted: 0, rejected: 2 });
  });

  test('moving an object to another fence key works with a token at least the object’s', async ({ app }) => {
    const key = uniq('moving-object');
    expect((await put(app, key, '10', 'a', { 'fence-key': uniq('fence-a') })).statusCode).toBe(200);
    const b = uniq('fence-b');
    expect((await put(app, key, '10', 'b', { 'fence-key': b })).json()).toMatchObject({ fenceKey: b, version: 2 });
    expect((await put(app, key, '11', 'b2', { 'fence-key': b })).json()).toMatchObject({ fenceKey: b, version: 3 });
    expect((await get(app, key)).body).toBe('b2');
  });
});
