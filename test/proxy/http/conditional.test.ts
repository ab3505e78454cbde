// Conditional requests on objects: If-Match and If-None-Match: * on PUT and DELETE answer 412
// precondition_failed when they do not hold, checked in the fenced write statement itself (a stale
// token still gets 409 first); If-None-Match on GET answers 304; ETags never come back for a key.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { testApp } from '../../support/proxy.ts';

let db: TestDatabase;
let app: FastifyInstance;
/** Proxy instances on the same database (app is the first): their statements race one another. */
let proxies: FastifyInstance[];
let n = 0;
const uniq = (p: string) => `cond/${p}-${++n}`;

beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 20 });
  proxies = Array.from({ length: 4 }, () => testApp(db.pool));
  app = proxies[0]!;
  await Promise.all(proxies.map((p) => p.ready()));
});
afterAll(async () => {
  await Promise.all(proxies.map((p) => p.close()));
  await db.drop();
});

const put = (key: string, token: string, body: string, headers: Record<string, string> = {}, target = app) =>
  target.inject({
    method: 'PUT',
    url: `/v1/objects/${key}`,
    headers: { 'fencing-token': token, 'content-type': 'text/plain', ...headers },
    payload: body,
  });
const del = (key: string, token: string, headers: Record<string, string> = {}) =>
  app.inject({ method: 'DELETE', url: `/v1/objects/${key}`, headers: { 'fencing-token': token, ...headers } });
const get = (key: string, headers: Record<string, string> = {}, target = app) => target.inject({ url: `/v1/objects/${key}`, headers });

async function counts(fenceKey: string): Promise<{ accepted: number; rejected: number; logged: number }> {
  const { rows } = await db.pool.query(
    `SELECT coalesce((SELECT sum(accepted) FROM fencepost.fence_counts WHERE fence_key = $1), 0)::int AS accepted,
            coalesce((SELECT sum(rejected) FROM fencepost.fence_counts WHERE fence_key = $1), 0)::int AS rejected,
            (SELECT count(*) FROM fencepost.rejections WHERE fence_key = $1)::int AS logged`,
    [fenceKey],
  );
  return rows[0] as { accepted: number; rejected: number; logged: number };
}

describe('PUT', () => {
  test('If-None-Match: * creates the object, and refuses with 412 once it exists', async () => {
    const key = uniq('create');
    const first = await put(key, '1', 'a', { 'if-none-match': '*' });
    expect(first.statusCode).toBe(200);
    const second = await put(key, '1', 'b', { 'if-none-match': '*' });
    expect(second.statusCode).toBe(412);
    expect(second.json()).toEqual({ error: 'precondition_failed', message: expect.any(String) });
    expect((await get(key)).body).toBe('a');
  });

  test('If-Match with the current ETag writes; with an old one 412 and nothing written', async () => {
    const key = uniq('match');
    const etag1 = (await put(key, '1', 'a')).headers.etag as string;
    const second = await put(key, '1', 'b', { 'if-match': etag1 });
    expect(second.statusCode).toBe(200);
    expect(second.json().version).toBe(2);
    const etag2 = second.json().etag as string;
    expect(etag2).not.toBe(etag1);
    expect((await put(key, '1', 'c', { 'if-match': etag1 })).statusCode).toBe(412);
    // A list matches when one of its tags does; a weak tag never matches a write (strong comparison).
    expect((await put(key, '1', 'c', { 'if-match': `W/${etag2}` })).statusCode).toBe(412);
    expect((await put(key, '1', 'c', { 'if-match': `"nope", ${etag2}` })).statusCode).toBe(200);
    expect((await get(key)).body).toBe('c');
  });

  test('If-Match: * needs the object to exist', async () => {
    const key = uniq('star');
    expect((await put(key, '1', 'a', { 'if-match': '*' })).statusCode).toBe(412);
    expect((await get(key)).statusCode).toBe(404);
    await put(key, '1', 'a');
    expect((await put(key, '1', 'b', { 'if-match': '*' })).statusCode).toBe(200);
  });

  test('an ETag never comes back after a delete: the old one does not match the key written again', async () => {
    const key = uniq('aba');
    const old = (await put(key, '1', 'first')).headers.etag as string;
    expect((await del(key, '1')).statusCode).toBe(204);
    const again = await put(key, '1', 'second');
    expect(again.json().version).toBe(1);
    expect(again.headers.etag).not.toBe(old);
    expect((await put(key, '1', 'third', { 'if-match': old })).statusCode).toBe(412);
    expect((await get(key, { 'if-none-match': old })).statusCode).toBe(200);
  });

  test('a malformed If-Match, or If-None-Match other than * on a write, gets 400 bad_request', async () => {
    const key = uniq('bad');
    const malformed: Record<string, string>[] = [{ 'if-match': 'abc' }, { 'if-match': '"a" "b"' }, { 'if-none-match': '"1.1"' }];
    for (const headers of malformed) {
      const res = await put(key, '1', 'x', headers);
      expect(res.statusCode, JSON.stringify(headers)).toBe(400);
      expect(res.json().error).toBe('bad_request');
    }
    expect((await get(key)).statusCode).toBe(404);
  });
});

describe('DELETE', () => {
  test('If-Match deletes only the object it names; a missing object fails it', async () => {
    const key = uniq('del');
    const etag = (await put(key, '1', 'a')).headers.etag as string;
    await put(key, '1', 'b');
    expect((await del(key, '1', { 'if-match': etag })).statusCode).toBe(412);
    expect((await get(key)).body).toBe('b');
    const current = (await get(key)).headers.etag as string;
    expect((await del(key, '1', { 'if-match': current })).statusCode).toBe(204);
    expect((await del(key, '1', { 'if-match': current })).statusCode).toBe(412);
    expect((await del(key, '1', { 'if-match': '*' })).statusCode).toBe(412);
  });

  test('If-None-Match: * deletes nothing: 412 when the object exists, 204 when it does not', async () => {
    const key = uniq('delnone');
    expect((await del(key, '1', { 'if-none-match': '*' })).statusCode).toBe(204);
    await put(key, '1', 'a');
    expect((await del(key, '1', { 'if-none-match': '*' })).statusCode).toBe(412);
    expect((await get(key)).body).toBe('a');
  });
});

describe('the fence comes first', () => {
  test('a stale token gets 409 stale_token even when its precondition fails too', async () => {
    const key = uniq('stale');
    await put(key, '5', 'a');
    const res = await put(key, '4', 'b', { 'if-match': '"0.0"' });
    expect(res.statusCode).toBe(409);
    expect(res.json().error).toBe('stale_token');
    expect((await del(key, '4', { 'if-none-match': '*' })).json().error).toBe('stale_token');
  });

  test("a write the object's own fence refuses gets 409 for that fence, not 412", async () => {
    const key = uniq('guarded');
    await put(key, '10', 'a');
    const res = await put(key, '5', 'b', { 'fence-key': uniq('elsewhere'), 'if-match': '"0.0"' });
    expect(res.statusCode).toBe(409);
    expect(res.json()).toMatchObject({ error: 'stale_token', fenceKey: key, highestToken: '10' });
  });

  test('a failed precondition counts neither as accepted nor as rejected, logs no rejection, and still raises its fence', async () => {
    const key = uniq('count');
    await put(key, '1', 'a');
    const before = await counts(key);
    expect((await put(key, '2', 'b', { 'if-none-match': '*' })).statusCode).toBe(412);
    expect(await counts(key)).toEqual(before);
    const fence = (await app.inject({ url: `/v1/fences/${encodeURIComponent(key)}` })).json();
    expect(fence.highestToken).toBe('2');
    // The holder of token 1 is now fenced off, as after any write with token 2.
    expect((await put(key, '1', 'c')).statusCode).toBe(409);
  });
});

describe('GET', () => {
  test('gives ETag and Object-Version; If-None-Match with its tag (weak or strong) or * answers 304 without a body', async () => {
    const key = uniq('get');
    await put(key, '3', 'a');
    await put(key, '3', 'b');
    const res = await get(key);
    expect(res.headers['object-version']).toBe('2');
    expect(res.headers['fencing-token']).toBe('3');
    const etag = res.headers.etag as string;
    for (const inm of [etag, `W/${etag}`, `"x", ${etag}`, '*']) {
      const cached = await get(key, { 'if-none-match': inm });
      expect(cached.statusCode, inm).toBe(304);
      expect(cached.body).toBe('');
      expect(cached.headers.etag).toBe(etag);
    }
    expect((await get(key, { 'if-none-match': '"0.1"' })).statusCode).toBe(200);
    await put(key, '3', 'c');
    const changed = await get(key, { 'if-none-match': etag });
    expect(changed.statusCode).toBe(200);
    expect(changed.body).toBe('c');
  });
});

describe('concurrency', () => {
  // Invariant: of N writers sending If-Match with the same ETag, exactly one writes; the rest get 412.
  test('N concurrent If-Match writers on one object: exactly one wins per version', async () => {
    const key = uniq('race');
    const WRITERS = 12;
    let etag = (await put(key, '1', 'v1')).headers.etag as string;
    for (let round = 2; round <= 6; round++) {
      const answers = await Promise.all(
        Array.from({ length: WRITERS }, (_, w) => put(key, '1', `r${round}w${w}`, { 'if-match': etag }, proxies[w % proxies.length])),
      );
      const winners = answers.flatMap((r, w) => (r.statusCode === 200 ? [{ r, w }] : []));
      expect(winners).toHaveLength(1);
      expect(answers.filter((r) => r.statusCode === 412)).toHaveLength(WRITERS - 1);
      const { r: won, w } = winners[0]!;
      expect(won.json().version).toBe(round);
      const read = await get(key);
      expect(read.body).toBe(`r${round}w${w}`);
      expect(read.headers.etag).toBe(won.headers.etag);
      etag = read.headers.etag as string;
    }
  });

  // Invariant: read-modify-write with If-Match loses no update, whatever the interleaving.
  test('compare-and-swap increments through four proxies lose no update', async () => {
    const key = uniq('counter');
    await put(key, '1', '0');
    const WRITERS = 6;
    const EACH = 8;
    let attempts = 0;
    await Promise.all(
      Array.from({ length: WRITERS }, async (_, w) => {
        const target = proxies[w % proxies.length];
        for (let done = 0; done < EACH;) {
          if (++attempts > 5000) throw new Error('too many attempts');
          const read = await get(key, {}, target);
          const res = await put(key, '1', String(Number(read.body) + 1), { 'if-match': read.headers.etag as string }, target);
          if (res.statusCode === 200) done++;
          else expect(res.statusCode).toBe(412);
        }
      }),
    );
    const final = await get(key);
    expect(final.body).toBe(String(WRITERS * EACH));
    expect(final.headers['object-version']).toBe(String(WRITERS * EACH + 1));
  });

  // Invariant: of N writers creating one key with If-None-Match: *, exactly one creates it.
  test('N concurrent If-None-Match: * creators: exactly one creates the object', async () => {
    const key = uniq('create-race');
    const answers = await Promise.all(
      Array.from({ length: 10 }, (_, w) => put(key, '1', `w${w}`, { 'if-none-match': '*' }, proxies[w % proxies.length])),
    );
    expect(answers.filter((r) => r.statusCode === 200)).toHaveLength(1);
    expect(answers.filter((r) => r.statusCode === 412)).toHaveLength(9);
    expect((await get(key)).headers['object-version']).toBe('1');
  });
});
