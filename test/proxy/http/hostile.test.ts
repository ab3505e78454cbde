// Hostile input. Property tests (fast-check) over methods, paths, keys, tokens, headers, bearer keys
// and bodies, against a real database: never a 500, every error a registry code with its status,
// and no error ever changes stored data. Then explicit cases over real HTTP.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import fc from 'fast-check';
import type { FastifyInstance } from 'fastify';
import { ERRORS, type ErrorCode } from '../../../src/proxy/errors.ts';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { listen } from '../../support/proxy.ts';
import { SECRET, adminQuery, bearer, rawHttp, securedApp, uniqueRole } from '../../support/keys.ts';

let db: TestDatabase;
let app: FastifyInstance;
let url: string;
const role = uniqueRole('hostile');
const BODY_LIMIT = 2048;

beforeAll(async () => {
  db = await createTestDatabase();
  await adminQuery(`CREATE ROLE ${role} NOLOGIN`);
  await db.pool.query(`
    CREATE SCHEMA app;
    CREATE TABLE app.items (id int PRIMARY KEY, v text NOT NULL);
    CREATE TABLE app.secret (x int);
    GRANT USAGE ON SCHEMA app TO ${role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON app.items TO ${role};
  `);
  app = securedApp(db.pool, role, { bodyLimitBytes: BODY_LIMIT, requestTimeoutMs: 400 });
  url = await listen(app);
});
afterAll(async () => {
  await app.close();
  await db.drop();
  await adminQuery(`DROP ROLE IF EXISTS ${role}`);
});

/** Everything a write could change (rejection counts aside: a refused write is counted). */
async function snapshot(opts: { raises?: boolean } = {}): Promise<string> {
  // raises: a fence's highest token is left out (a transaction's raise is a statement of its own, before the transaction).
  const { rows } = await db.pool.query(`SELECT
    (SELECT string_agg(fence_key || '|' || ${opts.raises ? "''" : 'highest_token'} || '|' || accepted, ',' ORDER BY fence_key) FROM fencepost.fence_stats WHERE ${opts.raises ? 'accepted > 0' : 'true'}) AS f,
    (SELECT string_agg(key || '|' || fence_key || '|' || token || '|' || version || '|' || md5(body), ',' ORDER BY key) FROM fencepost.objects) AS o,
    (SELECT string_agg(id || '|' || v, ',' ORDER BY id) FROM app.items) AS i`);
  return JSON.stringify(rows[0]);
}

async function fenceTokens(): Promise<Map<string, string>> {
  const { rows } = await db.pool.query<{ fence_key: string; highest_token: string }>(
    'SELECT fence_key, highest_token FROM fencepost.fences',
  );
  return new Map(rows.map((r) => [r.fence_key, r.highest_token]));
}

/** The only 5xx a healthy database may produce: the writer's own statement ran too long. */
const ALLOWED_5XX: readonly string[] = ['sql_timeout'];

function expectRegistryAnswer(res: { statusCode: number; body: string }, method: string): ErrorCode | null {
  expect(res.statusCode, res.body).not.toBe(500);
  if (res.statusCode < 400) return null;
  if (method === 'HEAD') return null;
  const body = JSON.parse(res.body) as { error: ErrorCode; message: unknown };
  expect(Object.keys(ERRORS), res.body).toContain(body.error);
  if (res.statusCode >= 500) expect(ALLOWED_5XX, res.body).toContain(body.error);
  expect(ERRORS[body.error].status, res.body).toBe(res.statusCode);
  expect(typeof body.message).toBe('string');
  return body.error;
}

// ---- arbitraries --------------------------------------------------------------------------------

const HOSTILE_KEYS = [
  `'; DROP TABLE fencepost.fences;--`,
  'w/ok',
  'w/',
  '',
  '..',
  '../..',
  'w/\u0000',
  'w/\ud800',
  'é'.repeat(600),
  'w/%',
  'o/x',
  'shared/1',
  'w/' + 'x'.repeat(1100),
];
const HOSTILE_TOKENS = [
  '-1',
  '1e3',
  '0x10',
  '+5',
  '99999999999999999999',
  '9223372036854775807',
  '9223372036854775808',
  '0',
  '0000000042',
  ' 5',
  '5 ',
  '',
  '1.0',
  '١٢',
  'NaN',
];
/** Header-safe text: printable latin1 (what a header can carry at all). */
const latin1 = fc.string({
  unit: fc
    .integer({ min: 0x20, max: 0xff })
    .filter((c) => c < 0x7f || c > 0x9f)
    .map((c) => String.fromCharCode(c)),
  maxLength: 40,
});
const anyKey = fc.oneof(
  fc.constantFrom(...HOSTILE_KEYS),
  fc.string({ unit: 'binary', maxLength: 30 }),
  fc.string({ maxLength: 30 }).map((s) => `w/${s}`),
);
const token = fc.oneof(
  fc.constantFrom(...HOSTILE_TOKENS),
  fc.bigInt({ min: 0n, max: 2n ** 63n - 1n }).map(String),
  fc.integer({ min: 0, max: 50 }).map(String),
  latin1,
);
const auth = fc.option(
  fc.constantFrom(...Object.values(SECRET).map((s) => `Bearer ${s}`), 'Bearer wrong', 'Basic abc', 'Bearer ', 'bearer ' + SECRET.writer),
  { nil: undefined },
);

function pathSegment(key: string): string {
  try {
    return encodeURIComponent(key);
  } catch {
    return key; // lone surrogate: send it raw
  }
}
const segment = fc.oneof(
  { weight: 4, arbitrary: anyKey.map(pathSegment) },
  { weight: 1, arbitrary: fc.constantFrom('%FF%FE', '%zz', '%', 'a%00b', '%C3%28', '..%2F..', 'w%2F%E2%82') },
);

const STATEMENTS = fc.oneof(
  fc.record({
    sql: fc.constant('INSERT INTO app.items VALUES ($1, $2)'),
    params: fc.tuple(fc.integer({ min: 0, max: 30 }), fc.string({ maxLength: 10 })),
  }),
  fc.record({
    sql: fc.constant('UPDATE app.items SET v = $1 WHERE id = $2'),
    params: fc.tuple(fc.string({ maxLength: 10 }), fc.integer({ min: 0, max: 30 })),
  }),
  fc.record({ sql: fc.constant('SELECT $1::int AS x'), params: fc.tuple(fc.jsonValue()) }),
  fc.record({ sql: fc.constant('INSERT INTO app.items VALUES ($1, $2)'), params: fc.array(fc.jsonValue(), { maxLength: 3 }) }),
  fc.constantFrom(
    { sql: 'SELEC 1' },
    { sql: 'SELECT 1/0' },
    { sql: 'SELECT * FROM app.secret' },
    { sql: 'DELETE FROM app.items' },
    { sql: 'COMMIT' },
    { sql: 'RESET ROLE' },
    { sql: 'SELECT 1; DROP TABLE app.items' },
    { sql: 'DROP TABLE app.items' },
    { sql: "SELECT set_config('role', 'postgres', true)" },
    { sql: 'UPDATE fencepost.fences SET highest_token = 0' },
    { sql: '' },
    { sql: 'SELECT pg_sleep(1)' },
  ),
  fc.record({ sql: fc.string({ maxLength: 40 }) }),
  fc.constant({ sql: "INSERT INTO app.items VALUES (7, 'a'), (7, 'b')" }), // always a unique violation
);
const txFence = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({ key: fc.constantFrom('w/t1', 'w/t2', 'shared/t'), token: fc.integer({ min: 0, max: 40 }).map(String) }),
  },
  // Fresh fences too: a refused transaction's raise (a statement of its own) stays, so the three above soon refuse most tokens.
  {
    weight: 2,
    arbitrary: fc.record({
      key: fc.integer({ min: 0, max: 10_000 }).map((n) => `w/f${n}`),
      token: fc.integer({ min: 0, max: 40 }).map(String),
    }),
  },
  { weight: 1, arbitrary: fc.record({ key: anyKey, token: fc.oneof(token, fc.jsonValue()) }, { requiredKeys: [] }) },
);
const txBody = fc.oneof(
  {
    weight: 4,
    arbitrary: fc
      .record({
        fences: fc.array(txFence, { minLength: 1, maxLength: 3 }),
        statements: fc.array(STATEMENTS, { minLength: 1, maxLength: 4 }),
      })
      .map((d) => JSON.stringify(d)),
  },
  { weight: 1, arbitrary: fc.jsonValue().map((v) => JSON.stringify(v)) },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.from(b)) },
);

const request = fc.record({
  method: fc.constantFrom('GET', 'PUT', 'DELETE', 'POST', 'PATCH', 'HEAD', 'OPTIONS'),
  route: fc.constantFrom(
    '/v1/objects/',
    '/v1/objects/',
    '/v1/fences/',
    '/v1/transactions',
    '/v1/stats?limit=',
    '/v1/fences?limit=',
    '/healthz',
    '/nope/',
  ),
  segment,
  token: fc.option(token, { nil: undefined }),
  fenceKey: fc.option(
    fc.oneof(
      latin1,
      anyKey.map((k) =>
        Buffer.from(k, 'utf8')
          .toString('latin1')
          .replace(/[\u0000-\u001f\u007f-\u009f]/g, ''),
      ),
    ),
    { nil: undefined },
  ),
  writerId: fc.option(latin1, { nil: undefined }),
  authorization: auth,
  contentType: fc.option(fc.constantFrom('application/json', 'text/plain', 'application/octet-stream', latin1.toString()), {
    nil: undefined,
  }),
  body: fc.oneof(
    fc.constant(undefined),
    fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b)),
    txBody,
    fc.constant(Buffer.alloc(BODY_LIMIT + 1)),
  ),
});

// ---- properties ---------------------------------------------------------------------------------

describe('properties', () => {
  test('any request: never a 500, every error from the registry with its status, and an error changes nothing', async () => {
    const seen = new Set<string>();
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        // A transaction's raise is a statement of its own, before the transaction: it stays when the
        // transaction then fails (its statements, counts and objects do not).
        const raises = r.route === '/v1/transactions';
        const before = await snapshot({ raises });
        const headers: Record<string, string> = {};
        if (r.token !== undefined) headers['fencing-token'] = r.token;
        if (r.fenceKey !== undefined) headers['fence-key'] = r.fenceKey;
        if (r.writerId !== undefined) headers['writer-id'] = r.writerId;
        if (r.authorization !== undefined) headers.authorization = r.authorization;
        if (r.contentType !== undefined) headers['content-type'] = r.contentType;
        const withBody = r.method !== 'GET' && r.method !== 'HEAD' && r.body !== undefined;
        const path = r.route.endsWith('/') || r.route.endsWith('=') ? r.route + r.segment : r.route;
        const res = await app.inject({ method: r.method as 'GET', url: path, headers, ...(withBody ? { payload: r.body } : {}) });
        const code = expectRegistryAnswer(res, r.method);
        seen.add(code ?? String(res.statusCode));
        if (res.statusCode >= 400) expect(await snapshot({ raises }), `${r.method} ${path} → ${res.body}`).toBe(before);
      }),
      { numRuns: 400 },
    );
    // The generator reaches both sides: accepted writes and many different refusals.
    expect(seen.has('200')).toBe(true);
    expect(seen.size).toBeGreaterThan(8);
  });

  test('any transaction: all or nothing, and every answer from the registry', async () => {
    // Two of the generated fences start at token 20, so a stale token (0–19) is reachable from the
    // first run, not only after a random transaction happened to commit a raise.
    for (const key of ['w/t1', 'w/t2']) {
      const raised = await app.inject({
        method: 'PUT',
        url: `/v1/fences/${encodeURIComponent(key)}`,
        headers: { ...bearer(SECRET.writer), 'fencing-token': '20' },
      });
      expect(raised.statusCode, raised.body).toBe(200);
    }
    const outcomes = new Set<string>();
    await fc.assert(
      fc.asyncProperty(txBody, fc.constantFrom(SECRET.writer, SECRET.writer, SECRET.other, SECRET.norole), async (body, secret) => {
        const before = await snapshot({ raises: true });
        const fencesBefore = await fenceTokens();
        const res = await app.inject({
          method: 'POST',
          url: '/v1/transactions',
          headers: { ...bearer(secret), 'content-type': 'application/json' },
          payload: body,
        });
        const code = expectRegistryAnswer(res, 'POST');
        outcomes.add(code ?? String(res.statusCode));
        if (res.statusCode >= 400) {
          // Nothing of the transaction applied; a fence may have been raised, only to a token of the request.
          expect(await snapshot({ raises: true }), res.body).toBe(before);
          const parsed = (() => {
            try {
              return (JSON.parse(body.toString()) ?? {}) as { fences?: { token?: unknown }[] };
            } catch {
              return {};
            }
          })();
          const tokens = new Set<string>((Array.isArray(parsed.fences) ? parsed.fences : []).map((f) => String(f?.token)));
          for (const [key, token] of await fenceTokens())
            if (fencesBefore.get(key) !== token) expect(tokens, `${key} → ${token}`).toContain(token);
          return;
        }
        // Committed: every statement ran and answered.
        const doc = JSON.parse(body.toString()) as { statements: { sql: string; params?: unknown[] }[] };
        const results = res.json().results as unknown[];
        expect(results).toHaveLength(doc.statements.length);
      }),
      // A fixed seed: the outcome kinds checked below are each reached by a few of the 250 runs, and
      // a random seed left one of them out now and then. FC_SEED explores other sequences.
      { numRuns: 250, seed: Number(process.env.FC_SEED ?? 20261130) },
    );
    expect(outcomes).toContain('200');
    for (const c of ['sql_error', 'sql_conflict', 'statement_not_allowed', 'stale_token']) expect(outcomes).toContain(c);
  });
});

// ---- explicit cases -----------------------------------------------------------------------------

describe('explicit hostile input', () => {
  const w = bearer(SECRET.writer);
  const put = (key: string, headers: Record<string, string>, payload: string | Buffer = 'v') =>
    app.inject({ method: 'PUT', url: `/v1/objects/${encodeURIComponent(key)}`, headers, payload });

  test.each(['-1', '1e3', '0x10', '+5', '99999999999999999999', '18446744073709551616', ' 7'])(
    'token %j gets 400 invalid_token, in a header or a transaction',
    async (t) => {
      const before = await snapshot();
      expect((await put('w/tok', { ...w, 'fencing-token': t })).json().error).toBe('invalid_token');
      const tx = await app.inject({
        method: 'POST',
        url: '/v1/transactions',
        headers: { ...w, 'content-type': 'application/json' },
        payload: JSON.stringify({ fences: [{ key: 'w/tok', token: t }], statements: [{ sql: 'SELECT 1' }] }),
      });
      expect(tx.json().error).toBe('invalid_token');
      expect(await snapshot()).toBe(before);
    },
  );

  test('deeply nested parameters are refused, not a stack overflow', async () => {
    const deep = '['.repeat(900) + ']'.repeat(900);
    const res = await app.inject({
      method: 'POST',
      url: '/v1/transactions',
      headers: { ...w, 'content-type': 'application/json' },
      payload: `{"fences":[{"key":"w/deep","token":"1"}],"statements":[{"sql":"SELECT $1::text","params":[${deep}]}]}`,
    });
    expect(res.json().error).toBe('invalid_transaction');
  });

  test('a SQL-looking key is stored and read back verbatim, and the tables are still there', async () => {
    const key = `w/'; DROP TABLE fencepost.fences;--`;
    const res = await put(
      key,
      { ...w, 'fencing-token': '3', 'fence-key': `w/"); DELETE FROM fencepost.objects; --`, 'writer-id': `'); DROP TABLE x;--` },
      'payload',
    );
    expect(res.statusCode, res.body).toBe(200);
    const got = await app.inject({ url: `/v1/objects/${encodeURIComponent(key)}`, headers: w });
    expect(got.body).toBe('payload');
    const { rows } = await db.pool.query('SELECT key, fence_key FROM fencepost.objects WHERE key = $1', [key]);
    expect(rows).toEqual([{ key, fence_key: `w/"); DELETE FROM fencepost.objects; --` }]);
    const tx = await app.inject({
      method: 'POST',
      url: '/v1/transactions',
      headers: { ...w, 'content-type': 'application/json' },
      payload: JSON.stringify({
        fences: [{ key: `w/'); DROP TABLE app.items;--`, token: '1' }],
        statements: [{ sql: 'SELECT count(*)::int AS n FROM app.items' }],
      }),
    });
    expect(tx.statusCode, tx.body).toBe(200);
    expect(
      (await db.pool.query(`SELECT to_regclass('fencepost.fences') IS NOT NULL AS f, to_regclass('app.items') IS NOT NULL AS i`)).rows[0],
    ).toEqual({ f: true, i: true });
  });

  test('invalid UTF-8 in the path, the Fence-Key header or a transaction body gets a 400 and writes nothing', async () => {
    const before = await snapshot();
    expect(
      (await app.inject({ method: 'PUT', url: '/v1/objects/w%2F%C3%28', headers: { ...w, 'fencing-token': '1' }, payload: 'v' })).json()
        .error,
    ).toBe('invalid_key');
    // Over real HTTP: the raw bytes C3 28 in a header.
    const raw = await rawHttp(url, [
      Buffer.concat([
        Buffer.from(
          `PUT /v1/objects/w%2Futf HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${SECRET.writer}\r\nFencing-Token: 1\r\nFence-Key: w/`,
        ),
        Buffer.from([0xc3, 0x28]),
        Buffer.from('\r\nContent-Length: 1\r\nConnection: close\r\n\r\nv'),
      ]),
    ]);
    expect(raw).toMatch(/^HTTP\/1\.1 400 /);
    expect(raw).toContain('"invalid_key"');
    const tx = await app.inject({
      method: 'POST',
      url: '/v1/transactions',
      headers: { ...w, 'content-type': 'application/json' },
      payload: Buffer.concat([
        Buffer.from('{"fences":[{"key":"w/'),
        Buffer.from([0xff]),
        Buffer.from('","token":"1"}],"statements":[{"sql":"SELECT 1"}]}'),
      ]),
    });
    expect(tx.json().error).toBe('invalid_transaction');
    expect(await snapshot()).toBe(before);
  });

  test('a missing or wrong bearer key gets 401 on every write route, before the body is looked at', async () => {
    const variants: Record<string, string>[] = [{}, { authorization: 'Bearer nope-nope-nope-nope' }, { authorization: SECRET.writer }];
    for (const headers of variants) {
      expect((await put('w/a', { ...headers, 'fencing-token': '1' })).statusCode).toBe(401);
      expect((await app.inject({ method: 'PUT', url: '/v1/fences/w%2Fa', headers: { ...headers, 'fencing-token': '1' } })).statusCode).toBe(
        401,
      );
      expect(
        (await app.inject({ method: 'POST', url: '/v1/transactions', headers, payload: Buffer.alloc(BODY_LIMIT + 10) })).statusCode,
      ).toBe(401);
    }
  });

  test('oversized headers over real HTTP get 431 and write nothing', async () => {
    const before = await snapshot();
    const res = await rawHttp(url, [
      `PUT /v1/objects/w%2Fbig HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${SECRET.writer}\r\nFencing-Token: 1\r\nFence-Key: w/${'k'.repeat(17_000)}\r\nContent-Length: 1\r\n\r\nv`,
    ]);
    expect(res).toMatch(/^HTTP\/1\.1 431 /);
    expect(await snapshot()).toBe(before);
  });

  test('a body over the limit gets 413 over real HTTP too, and writes nothing', async () => {
    const before = await snapshot();
    const res = await fetch(`${url}/v1/objects/w%2Fhuge`, {
      method: 'PUT',
      headers: { ...w, 'fencing-token': '1' },
      body: Buffer.alloc(BODY_LIMIT + 1),
    });
    expect(res.status).toBe(413);
    expect(((await res.json()) as { error: string }).error).toBe('payload_too_large');
    expect(await snapshot()).toBe(before);
  });

  test('a slow body (one byte every 100 ms) is cut off with 408 after the request timeout and writes nothing', async () => {
    const before = await snapshot();
    const head = `PUT /v1/objects/w%2Fslow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${SECRET.writer}\r\nFencing-Token: 1\r\nContent-Length: 40\r\n\r\n`;
    const res = await rawHttp(url, [head, ...Array.from({ length: 40 }, () => 'x')], 100);
    expect(res).toMatch(/^HTTP\/1\.1 408 /);
    // A 408 is the cut itself: a body that had arrived whole would have been answered otherwise (no wall-clock bound).
    expect(res).toContain('"request_timeout"');
    expect(await snapshot()).toBe(before);
  });

  test('a slow chunked transaction body is cut off the same way', async () => {
    const before = await snapshot();
    const body = JSON.stringify({
      fences: [{ key: 'w/slowtx', token: '1' }],
      statements: [{ sql: 'INSERT INTO app.items VALUES (999, $1)', params: ['x'] }],
    });
    const head = `POST /v1/transactions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${SECRET.writer}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`;
    const chunks = [...body].map((c) => `1\r\n${c}\r\n`);
    const res = await rawHttp(url, [head, ...chunks.slice(0, 10)], 100);
    expect(res).toMatch(/^HTTP\/1\.1 408 /);
    expect(await snapshot()).toBe(before);
  });
});
