// The rejection log, on each of the three doors (HTTP object writes, POST /v1/transactions, the SQL
// endpoint): a rejection lands with its door, a deadlock while recording it is retried, and a
// recording that fails is logged once at warn with the door.
import { portRangeEnv } from '../../tools/ports.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Writable } from 'node:stream';
import pg from 'pg';
import { pino } from 'pino';
import { loadConfig } from '../../src/proxy/config.ts';
import { migrate } from '../../src/fence/migrate.ts';
import { startProxy, type RunningProxy } from '../../src/proxy/server.ts';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../support/db.ts';
import { fenceOptions } from '../support/sql.ts';

type Door = 'http' | 'transaction' | 'sql';
const DOORS: readonly Door[] = ['http', 'transaction', 'sql'];

interface Proxy {
  proxy: RunningProxy;
  /** The proxy's log lines, parsed. */
  lines: Record<string, unknown>[];
}

let db: TestDatabase;
/** Lock timeout well above deadlock_timeout (1 s), so a recording that waits is ended by the deadlock check. */
let patient: Proxy;
/** Lock timeout 200 ms: a recording that waits on a lock fails. */
let impatient: Proxy;

async function start(lockTimeoutMs: number): Promise<Proxy> {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString().split('\n')) if (l !== '') lines.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  const config = loadConfig({
    DATABASE_URL: db.url,
    PORT: '0',
    FENCEPOST_PGWIRE_PORT: '0',
    FENCEPOST_CLIENT_ROLE: clientRoleFor(db.url),
    FENCEPOST_LOCK_TIMEOUT_MS: String(lockTimeoutMs),
    ...portRangeEnv(),
  });
  return { proxy: await startProxy(config, pino({ level: 'warn' }, sink)), lines };
}

beforeAll(async () => {
  db = await createTestDatabase();
  patient = await start(5000);
  impatient = await start(200);
});
afterAll(async () => {
  await patient?.proxy.close();
  await impatient?.proxy.close();
  await db?.drop();
});

const raise = async (p: Proxy, fenceKey: string, token: number) => {
  const res = await p.proxy.app.inject({
    method: 'PUT',
    url: `/v1/fences/${encodeURIComponent(fenceKey)}`,
    headers: { 'fencing-token': String(token) },
  });
  expect(res.statusCode, res.body).toBe(200);
};

/** Sends one write with `token` through `door` on `fenceKey`; resolves to what the writer was answered. */
async function writeThrough(p: Proxy, door: Door, fenceKey: string, token: number): Promise<string> {
  if (door === 'http') {
    const res = await p.proxy.app.inject({
      method: 'PUT',
      url: `/v1/objects/${encodeURIComponent(`${fenceKey}/obj`)}`,
      headers: { 'fencing-token': String(token), 'fence-key': fenceKey, 'writer-id': 'zombie' },
      payload: 'x',
    });
    return String(res.statusCode);
  }
  if (door === 'transaction') {
    const res = await p.proxy.app.inject({
      method: 'POST',
      url: '/v1/transactions',
      headers: { 'content-type': 'application/json', 'writer-id': 'zombie' },
      payload: JSON.stringify({ fences: [{ key: fenceKey, token: String(token) }], statements: [{ sql: 'SELECT 1' }] }),
    });
    return String(res.statusCode);
  }
  const url = new URL(`postgres://zombie@127.0.0.1:${p.proxy.pgwirePort}/${new URL(db.url).pathname.slice(1)}`);
  url.searchParams.set('options', fenceOptions(token, fenceKey));
  const c = new pg.Client({ connectionString: url.toString() });
  c.on('error', () => {});
  // A stale token is refused at connect (FP409): the connection is never made.
  const refused = await c.connect().then(
    () => null,
    (e: { code?: string }) => e.code ?? String(e),
  );
  if (refused !== null) return refused;
  try {
    return await c.query('SELECT 1').then(
      () => 'ok',
      (e: { code?: string }) => e.code ?? String(e),
    );
  } finally {
    await c.end();
  }
}

/** What a stale write is answered on each door. */
const STALE: Record<Door, string> = { http: '409', transaction: '409', sql: 'FP409' };

const logged = async (fenceKey: string) =>
  (
    await db.pool.query<{ operation: string; door: string; token: string }>(
      'SELECT operation, door, token::text FROM fencepost.rejections WHERE fence_key = $1 ORDER BY id',
      [fenceKey],
    )
  ).rows;

/** Resolves once a session waits for fencepost.rejections while it holds fencepost.totals: the recording statement. */
async function recordingWaits(): Promise<void> {
  const waiting = `
SELECT 1 FROM pg_locks w JOIN pg_locks h USING (pid)
WHERE w.relation = 'fencepost.rejections'::regclass AND NOT w.granted
  AND h.relation = 'fencepost.totals'::regclass AND h.granted AND h.mode = 'RowExclusiveLock'`;
  await expect.poll(async () => (await db.pool.query(waiting)).rowCount, { interval: 20, timeout: 10_000 }).toBe(1);
}

const warnings = (p: Proxy, door: Door, fenceKey: string) =>
  p.lines.filter(
    (l) => l.msg === 'could not record a rejection' && l.level === 40 && l.door === door && (l.fenceKeys as string[]).includes(fenceKey),
  );

describe('every door records its rejections in one log', () => {
  test('a stale write on each door lands in GET /v1/rejections with its door (SQL endpoint: operation transaction, door sql)', async () => {
    await raise(patient, 'doors', 10);
    for (const door of DOORS) expect(await writeThrough(patient, door, 'doors', 3)).toBe(STALE[door]);
    let items: { operation: string; door: string; token: string }[] = [];
    await expect
      .poll(async () => {
        const res = await patient.proxy.app.inject({ url: '/v1/rejections?fenceKey=doors' });
        items = (res.json() as { rejections: { operation: string; door: string; token: string }[] }).rejections;
        return items.length;
      })
      .toBe(3);
    expect(items.map(({ operation, door, token }) => ({ operation, door, token }))).toEqual([
      { operation: 'transaction', door: 'sql', token: '3' },
      { operation: 'transaction', door: 'transaction', token: '3' },
      { operation: 'put', door: 'http', token: '3' },
    ]);
  });
});

describe('a failure to record', () => {
  // A session holds the log locked; the recording statement waits for it while holding
  // fencepost.totals. The session then takes totals: a deadlock, and Postgres aborts the
  // recording, which waited first (deadlock_timeout, 1 s). The session's lock is granted only
  // once that attempt has rolled back, so the one row that lands is a retry's.
  test.each(DOORS)(
    'a deadlock while recording is retried on door %s: the rejection lands once, the writer is answered stale',
    async (door) => {
      const fenceKey = `deadlock-${door}`;
      await raise(patient, fenceKey, 10);
      const blocker = new pg.Client({ connectionString: db.url });
      await blocker.connect();
      try {
        await blocker.query('BEGIN');
        await blocker.query('LOCK TABLE fencepost.rejections IN EXCLUSIVE MODE');
        const answer = writeThrough(patient, door, fenceKey, 4);
        await recordingWaits();
        await blocker.query('LOCK TABLE fencepost.totals IN EXCLUSIVE MODE'); // granted once the recording's attempt is aborted
        await blocker.query('COMMIT');
        expect(await answer).toBe(STALE[door]);
      } finally {
        await blocker.end();
      }
      await expect.poll(() => logged(fenceKey)).toEqual([{ operation: door === 'http' ? 'put' : 'transaction', door, token: '4' }]);
      expect(warnings(patient, door, fenceKey)).toEqual([]);
    },
  );

  // A lock timeout (55P03) is no lost race: no door retries it. Each logs it once; the SQL
  // endpoint's writer is answered its refusal all the same.
  test.each(DOORS)('a recording that fails on door %s is logged once at warn with the door', async (door) => {
    const fenceKey = `failed-${door}`;
    await raise(impatient, fenceKey, 10);
    const blocker = new pg.Client({ connectionString: db.url });
    await blocker.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query('LOCK TABLE fencepost.rejections IN EXCLUSIVE MODE');
      expect(await writeThrough(impatient, door, fenceKey, 4)).toBe(door === 'sql' ? 'FP409' : '503');
      await expect.poll(() => warnings(impatient, door, fenceKey).length).toBe(1);
      await new Promise((r) => setTimeout(r, 300)); // past another lock timeout: still one
      expect(warnings(impatient, door, fenceKey)).toHaveLength(1);
      await blocker.query('COMMIT');
    } finally {
      await blocker.end();
    }
    expect(await logged(fenceKey)).toEqual([]);
  });
});

describe('migration 0016 (the door column)', () => {
  test('backfills transaction for operation transaction and http otherwise; an insert naming no door (a proxy of the previous version) reads http; no other door is accepted', async () => {
    const old = await createTestDatabase({ migrate: false });
    try {
      await migrate(old.pool, { upTo: 15 });
      const insert = (operation: string) =>
        old.pool.query(
          `INSERT INTO fencepost.rejections (fence_key, object_key, operation, token, highest_token) VALUES ('m', NULL, $1, 1, 2)`,
          [operation],
        );
      for (const op of ['put', 'delete', 'fence', 'transaction']) await insert(op);
      await migrate(old.pool);
      await insert('transaction');
      await insert('put');
      const { rows } = await old.pool.query('SELECT operation, door FROM fencepost.rejections ORDER BY id');
      expect(rows).toEqual([
        { operation: 'put', door: 'http' },
        { operation: 'delete', door: 'http' },
        { operation: 'fence', door: 'http' },
        { operation: 'transaction', door: 'transaction' },
        { operation: 'transaction', door: 'http' }, // an older proxy's row names no door: the default
        { operation: 'put', door: 'http' },
      ]);
      await expect(
        old.pool.query(
          `INSERT INTO fencepost.rejections (fence_key, operation, token, highest_token, door) VALUES ('m', 'put', 1, 2, 'smtp')`,
        ),
      ).rejects.toMatchObject({ code: '23514', constraint: 'rejections_door' });
    } finally {
      await old.drop();
    }
  });
});
