// The fence's lock modes, shown without timing: writes with the fence's own token share the fence
// row (a write goes through while another holds the row in share mode; two transactions of one
// leader run at once), and only a raise takes it exclusively (it waits for every holder of the
// older token and commits after them). Each test proves who waited on whom from pg_stat_activity
// and promise states, never from durations.
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { buildApp } from '../../src/proxy/http/app.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../support/db.ts';
import { settled } from '../support/locks.ts';
import { checkRace, runRace } from '../support/race.ts';
import { listen, spawnProxy, type ProxyProcess } from '../support/proxy.ts';

let db: TestDatabase;
let app: FastifyInstance;

beforeAll(async () => {
  db = await createTestDatabase();
  app = buildApp({
    store: new FenceStore(db.pool, STORE_DEFAULTS),
    bodyLimitBytes: 1024 * 1024,
    // Long lock waits are the point here: the test decides when holders let go.
    transactions: { clientRole: clientRoleFor(db.pool), lockTimeoutMs: 60_000, statementTimeoutMs: 60_000, transactionTimeoutMs: 60_000 },
  });
  await app.ready();
});
afterAll(async () => {
  await app.close();
  await db.drop();
});

const put = (key: string, fenceKey: string, token: number) =>
  app.inject({
    method: 'PUT',
    url: `/v1/objects/${encodeURIComponent(key)}`,
    headers: { 'fence-key': fenceKey, 'fencing-token': String(token) },
    payload: `${key}@${token}`,
  });
const advance = (fenceKey: string, token: number) =>
  app.inject({ method: 'PUT', url: `/v1/fences/${encodeURIComponent(fenceKey)}`, headers: { 'fencing-token': String(token) } });
const tx = (fenceKey: string, token: number, sql: string) =>
  app.inject({
    method: 'POST',
    url: '/v1/transactions',
    headers: { 'content-type': 'application/json' },
    payload: { fences: [{ key: fenceKey, token: String(token) }], statements: [{ sql }] },
  });

/** Resolves once a backend runs `pattern` and waits on a lock. */
async function waitingOnLock(pattern: string): Promise<void> {
  for (let i = 0; i < 600; i++) {
    const { rows } = await db.pool.query(`SELECT 1 FROM pg_stat_activity WHERE wait_event_type IN ('Lock', 'Advisory') AND query LIKE $1`, [
      pattern,
    ]);
    if (rows.length > 0) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`no backend waiting on a lock for ${pattern}`);
}

describe("writes with the fence's token share it; a raise takes it alone", () => {
  test("a write with the fence's token goes through while another session holds the fence in share mode", async () => {
    expect((await advance('shared-a', 5)).statusCode).toBe(200);
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT 1 FROM fencepost.fences WHERE fence_key = 'shared-a' FOR SHARE`);
      // With an exclusive lock per write this would wait for the holder, forever.
      expect((await put('shared-a/1', 'shared-a', 5)).statusCode).toBe(200);
      expect((await put('shared-a/2', 'shared-a', 5)).statusCode).toBe(200);
    } finally {
      await holder.query('ROLLBACK');
      await holder.end();
    }
  });

  test('a raise waits for a session holding the fence in share mode, then commits; the old token is stale after it', async () => {
    expect((await advance('shared-b', 5)).statusCode).toBe(200);
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT 1 FROM fencepost.fences WHERE fence_key = 'shared-b' FOR SHARE`);
      const raise = advance('shared-b', 6);
      const state = settled(raise);
      await waitingOnLock('%fencepost.fences%');
      expect(state.done).toBe(false); // it waits for the holder of token 5
      await holder.query('COMMIT');
      expect((await raise).statusCode).toBe(200);
    } finally {
      await holder.end();
    }
    expect((await put('shared-b/1', 'shared-b', 5)).statusCode).toBe(409);
  });

  test('two transactions of one leader on one fence run at once; a raise ends the one still open after its wait', async () => {
    // Invariants: a leader's transactions do not wait for one another; a raise does not wait on an
    // older token's transaction past its wait (the raise ends its connection), and that
    // transaction is answered stale.
    expect((await advance('shared-tx', 3)).statusCode).toBe(200);
    const gate = new pg.Client({ connectionString: db.url });
    await gate.connect();
    try {
      await gate.query('SELECT pg_advisory_lock(7701)');
      // Transaction 1 holds its connection's fence and waits at the gate.
      const first = tx('shared-tx', 3, 'SELECT pg_advisory_xact_lock_shared(7701)');
      const firstState = settled(first);
      await waitingOnLock('SELECT pg_advisory_xact_lock_shared(7701)%');
      // Transaction 2, same fence and token, does not wait for transaction 1.
      const second = await tx('shared-tx', 3, 'SELECT 1');
      expect(second.statusCode, second.body).toBe(200);
      expect(firstState.done).toBe(false);
      // The raise ends transaction 1 (still at the gate) after its wait, and commits.
      expect((await advance('shared-tx', 4)).statusCode).toBe(200);
      const ended = await first;
      expect(ended.statusCode, ended.body).toBe(409);
      expect(ended.json()).toMatchObject({ error: 'stale_token', highestToken: '4' });
    } finally {
      await gate.end();
    }
    const stale = await tx('shared-tx', 3, 'SELECT 1');
    expect(stale.statusCode).toBe(409);
    expect(stale.json()).toMatchObject({ error: 'stale_token', highestToken: '4' });
  });

  test('writes of a lower token in a batch with a raise of the same fence are stale, never accepted after it', async () => {
    // One batch: many writes of token 8 and one of token 9 (the store may put them together).
    expect((await advance('shared-mix', 8)).statusCode).toBe(200);
    const results = await Promise.all([
      ...Array.from({ length: 20 }, (_, i) => put(`shared-mix/${i}`, 'shared-mix', 8)),
      put('shared-mix/raise', 'shared-mix', 9),
      ...Array.from({ length: 20 }, (_, i) => put(`shared-mix/${20 + i}`, 'shared-mix', 8)),
    ]);
    expect(results[20]!.statusCode).toBe(200);
    for (const r of results) expect([200, 409]).toContain(r.statusCode);
    // Whatever the interleaving, no token-8 write committed after the raise did. Commit order, not
    // start time: a token-8 write that started after the raise's statement may share the fence
    // before the raise gets it, and commit first (track_commit_timestamp: the suite's Postgres).
    const tracked =
      (await db.pool.query<{ track_commit_timestamp: string }>('SHOW track_commit_timestamp')).rows[0]!.track_commit_timestamp === 'on';
    if (tracked) {
      const { rows } = await db.pool.query(
        `SELECT o.key, o.token FROM fencepost.objects o, fencepost.fences f
          WHERE f.fence_key = 'shared-mix' AND o.fence_key = 'shared-mix' AND o.token = 8
            AND pg_xact_commit_timestamp(o.xmin) > pg_xact_commit_timestamp(f.xmin)`,
      );
      expect(rows).toEqual([]);
    }
    // And every token-8 write sent once the raise was acknowledged is stale.
    const after = await Promise.all(Array.from({ length: 10 }, (_, i) => put(`shared-mix/after-${i}`, 'shared-mix', 8)));
    expect(after.map((r) => r.statusCode)).toEqual(Array(10).fill(409));
  });
});

describe('race: one fence key, many objects, two interleaved tokens and raises', () => {
  // Invariants (checkRace): every accepted write's token is ≥ every token acknowledged before it
  // was sent; per object, accepted writes in version order have gapless versions and rising tokens.
  test('32 writers over one in-process proxy', async () => {
    const one = buildApp({ store: new FenceStore(db.pool, { ...STORE_DEFAULTS, concurrency: 2 }), bodyLimitBytes: 1024 * 1024 });
    const base = await listen(one);
    const objectKeys = Array.from({ length: 40 }, (_, i) => `ilv-one/${i}`);
    const records = await runRace({ urls: [base], fenceKey: 'ilv-one', objectKeys, writers: 32, writesPerWriter: 25, maxLag: 1 }).finally(
      () => one.close(),
    );
    expect(checkRace(records)).toEqual([]);
    expect(records.some((r) => r.status === 200)).toBe(true);
    expect(records.some((r) => r.status === 409)).toBe(true);
  });

  test('32 writers over two proxy processes on one database', async () => {
    const env = { DATABASE_URL: db.url, FENCEPOST_POOL_SIZE: '4' };
    const proxies: ProxyProcess[] = await Promise.all([spawnProxy(env), spawnProxy(env)]);
    try {
      const objectKeys = Array.from({ length: 40 }, (_, i) => `ilv-two/${i}`);
      const records = await runRace({
        urls: proxies.map((p) => p.url),
        fenceKey: 'ilv-two',
        objectKeys,
        writers: 32,
        writesPerWriter: 25,
        maxLag: 1,
      });
      expect(checkRace(records)).toEqual([]);
      for (const p of proxies) expect(records.some((r) => r.url === p.url && (r.status === 200 || r.status === 409))).toBe(true);
      // Counts agree with the answers: every 200 counted accepted, every 409 rejected.
      const fence = (await (await fetch(`${proxies[0]!.url}/v1/fences/ilv-two`)).json()) as { accepted: number; rejected: number };
      expect(fence.accepted).toBe(records.filter((r) => r.status === 200).length);
      expect(fence.rejected).toBe(records.filter((r) => r.status === 409).length);
    } finally {
      await Promise.all(proxies.map((p) => p.stop()));
    }
  });
});
