// The fence's durability, checked all the time (src/fence/durability-monitor.ts): the monitor logs
// a change once, /metrics and GET /readyz show its latest report, and with
// FENCEPOST_REQUIRE_SYNC_STANDBY=1 every door refuses writes (503 durability_unsafe; SQL endpoint
// FP533) while a failover could lose a fence raise, and takes them again once it could not. Real
// primary, real synchronous standby: stopped (none streams, commits would hang) and paused
// (commits wait on SyncRep).
import { portRangeEnv } from '../../tools/ports.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Writable } from 'node:stream';
import pg from 'pg';
import pino from 'pino';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { startReplicatedPostgres, type ReplicatedPostgres } from '../support/replication.ts';
import { fenceOptions } from '../support/sql.ts';
import { DurabilityMonitor } from '../../src/fence/durability-monitor.ts';
import { createPool, startProxy, type RunningProxy } from '../../src/proxy/server.ts';
import { ConfigError, loadConfig } from '../../src/proxy/config.ts';
import { ProxyMetrics } from '../../src/proxy/metrics.ts';
import { DURABILITY_UNSAFE } from '../../src/fence/codes.ts';

interface LogLine {
  level: number;
  msg: string;
  component?: string;
  reason?: string;
}

function logSink(): { lines: LogLine[]; logger: pino.Logger } {
  const lines: LogLine[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(line) as LogLine);
      done();
    },
  });
  return { lines, logger: pino({ level: 'info' }, sink) };
}

/** Polls `probe` until it returns a value (not undefined); fails after `timeoutMs` with `what`. */
async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('configuration', () => {
  test('FENCEPOST_DURABILITY_CHECK_MS defaults to 10 s and FENCEPOST_REQUIRE_SYNC_STANDBY to off', () => {
    expect(loadConfig({})).toMatchObject({ durabilityCheckMs: 10_000, requireSyncStandby: false });
    expect(loadConfig({ FENCEPOST_DURABILITY_CHECK_MS: '500', FENCEPOST_REQUIRE_SYNC_STANDBY: '1' })).toMatchObject({
      durabilityCheckMs: 500,
      requireSyncStandby: true,
    });
  });

  test.each([
    ['FENCEPOST_DURABILITY_CHECK_MS', '10'],
    ['FENCEPOST_DURABILITY_CHECK_MS', 'soon'],
    ['FENCEPOST_REQUIRE_SYNC_STANDBY', 'yes'],
  ])('a bad %s (%j) fails fast naming the variable', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(name);
  });
});

describe('the monitor on a database without standbys', () => {
  let db: TestDatabase;
  let pool: pg.Pool;
  const database = () => new URL(db.url).pathname.slice(1);
  beforeAll(async () => {
    db = await createTestDatabase({ poolSize: 2 });
    pool = createPool(db.url, 2);
  });
  afterAll(async () => {
    await pool.end();
    await db.drop();
  });

  test('logs a warning once when a reason appears and an info line when it clears, not at every check', async () => {
    const { lines, logger } = logSink();
    const monitor = new DurabilityMonitor(pool, { intervalMs: 0, requireSyncStandby: false, logger });
    try {
      await monitor.check();
      await db.pool.query(`ALTER DATABASE ${database()} SET synchronous_commit = local`);
      for (let i = 0; i < 3; i++) await monitor.check();
      await db.pool.query(`ALTER DATABASE ${database()} RESET synchronous_commit`);
      for (let i = 0; i < 2; i++) await monitor.check();
    } finally {
      await db.pool.query(`ALTER DATABASE ${database()} RESET synchronous_commit`);
      await monitor.stop();
    }
    const ours = lines.filter((l) => l.component === 'durability');
    expect(ours.map((l) => [l.level, l.reason ?? null])).toEqual([
      [40, 'synchronous_commit_below_on'],
      [30, 'synchronous_commit_below_on'],
      [30, null],
    ]);
    expect(ours[0]!.msg).toMatch(/^synchronous_commit is local/);
  });

  test('/metrics shows the latest report per reason, every reason at 0 when safe', async () => {
    const monitor = new DurabilityMonitor(pool, { intervalMs: 0, requireSyncStandby: true, logger: null });
    const metrics = new ProxyMetrics(pool, { processMetrics: false, durability: monitor });
    // Before the first check nothing is known to be safe: refused.
    expect(monitor.refusal()).toEqual({ reasons: ['check_failed'], warnings: [expect.any(String)] });
    await monitor.check();
    // No standby at all: with one required, an empty synchronous_standby_names is the reason.
    let text = await metrics.text();
    expect(text).toContain('fencepost_fence_durability_unsafe{reason="no_sync_standby"} 1');
    expect(text).toContain('fencepost_fence_durability_unsafe{reason="async_standby"} 0');
    expect(text).toContain('fencepost_fence_durability_refusing_writes 1');
    expect(text).toContain('fencepost_fence_durability_sync_standbys 0');
    const relaxed = new DurabilityMonitor(pool, { intervalMs: 0, requireSyncStandby: false, logger: null });
    const relaxedMetrics = new ProxyMetrics(pool, { processMetrics: false, durability: relaxed });
    await relaxed.check();
    text = await relaxedMetrics.text();
    for (const reason of [
      'synchronous_commit_below_on',
      'async_standby',
      'no_sync_standby_streaming',
      'waiting_on_standby',
      'no_sync_standby',
      'check_failed',
    ]) {
      expect(text).toContain(`fencepost_fence_durability_unsafe{reason="${reason}"} 0`);
    }
    expect(text).toContain('fencepost_fence_durability_refusing_writes 0');
    expect(text).toContain('fencepost_fence_durability_waiting_backends 0');
  });

  test('a check that cannot reach the database is the reason check_failed, and refuses writes when a standby is required', async () => {
    const gone = createPool('postgres://nobody:x@127.0.0.1:1/none', 1);
    const { lines, logger } = logSink();
    const monitor = new DurabilityMonitor(gone, { intervalMs: 0, requireSyncStandby: true, logger });
    try {
      const report = await monitor.check();
      expect(report.reasons).toEqual(['check_failed']);
      expect(monitor.refusal()?.reasons).toEqual(['check_failed']);
      expect(lines.filter((l) => l.component === 'durability' && l.reason === 'check_failed')).toHaveLength(1);
    } finally {
      await gone.end();
    }
  });
});

describe('FENCEPOST_REQUIRE_SYNC_STANDBY=1 with a real synchronous standby', () => {
  let repl: ReplicatedPostgres;
  let admin: pg.Client;
  let proxy: RunningProxy;
  let url: string;
  const log = logSink();
  const sqlUrl = (options?: string) => {
    const u = new URL(`postgres://writer@127.0.0.1:${proxy.pgwirePort}/postgres`);
    if (options !== undefined) u.searchParams.set('options', options);
    return u.toString();
  };
  const sqlClient = async (options?: string) => {
    const c = new pg.Client({ connectionString: sqlUrl(options) });
    c.on('error', () => {});
    await c.connect();
    return c;
  };
  const ready = async () => {
    const res = await fetch(`${url}/readyz`);
    return {
      status: res.status,
      body: (await res.json()) as {
        status?: string;
        error?: string;
        reasons?: string[];
        durability?: { reasons: string[]; waitingOnStandby: number };
      },
    };
  };
  const metricsText = async () => await (await fetch(`${url}/metrics`)).text();
  const put = (path: string, token: string, headers: Record<string, string> = {}, body?: string) =>
    fetch(`${url}${path}`, { method: 'PUT', headers: { 'fencing-token': token, ...headers }, ...(body !== undefined ? { body } : {}) });
  const transaction = (id: string, token: string) =>
    fetch(`${url}/v1/transactions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        fences: [{ key: 'dur/tx', token }],
        statements: [{ sql: 'INSERT INTO public.ledger (id) VALUES ($1)', params: [id] }],
      }),
    });
  const ledger = async () => (await admin.query<{ id: string }>('SELECT id FROM public.ledger ORDER BY id')).rows.map((r) => r.id);

  beforeAll(async () => {
    repl = await startReplicatedPostgres('fp_sync');
    admin = new pg.Client({ connectionString: repl.url });
    await admin.connect();
    await admin.query(`ALTER SYSTEM SET synchronous_standby_names = 'fp_sync'`);
    await admin.query('SELECT pg_reload_conf()');
    await until('the standby to be synchronous', async () => {
      const { rows } = await admin.query<{ sync_state: string }>(
        `SELECT sync_state FROM pg_stat_replication WHERE application_name = 'fp_sync'`,
      );
      return rows[0]?.sync_state === 'sync' ? true : undefined;
    });
    proxy = await startProxy(
      loadConfig({
        DATABASE_URL: repl.url,
        PORT: '0',
        FENCEPOST_PGWIRE_PORT: '0',
        FENCEPOST_DURABILITY_CHECK_MS: '100',
        FENCEPOST_REQUIRE_SYNC_STANDBY: '1',
        ...portRangeEnv(),
      }),
      log.logger,
    );
    url = proxy.url;
    await admin.query('CREATE TABLE public.ledger (id text PRIMARY KEY)');
    await admin.query('GRANT SELECT, INSERT ON public.ledger TO fencepost_client');
  }, 120_000);

  afterAll(async () => {
    await proxy?.close();
    await admin?.end();
    await repl?.stop();
  });

  test('with the synchronous standby streaming: ready, nothing unsafe, writes accepted on every door', async () => {
    const r = await ready();
    expect(r.status).toBe(200);
    expect(r.body.durability?.reasons).toEqual([]);
    expect((await put('/v1/objects/dur/http/1', '1', { 'fence-key': 'dur/http' }, 'one')).status).toBe(200);
    expect((await put('/v1/fences/dur-fence', '1')).status).toBe(200);
    expect((await transaction('tx-1', '1')).status).toBe(200);
    const c = await sqlClient(fenceOptions(1, 'dur/sql'));
    try {
      await c.query(`INSERT INTO public.ledger (id) VALUES ('sql-1')`);
    } finally {
      await c.end();
    }
    expect(await ledger()).toEqual(['sql-1', 'tx-1']);
    const text = await metricsText();
    expect(text).toContain('fencepost_fence_durability_refusing_writes 0');
    expect(text).toContain('fencepost_fence_durability_sync_standbys 1');
  });

  test('no synchronous standby streaming: every door refuses writes with durability_unsafe and nothing lands; reads go on; accepted again once it streams', async () => {
    const sql = await sqlClient(fenceOptions(2, 'dur/sql'));
    const reader = await sqlClient(); // no token: read-only transactions
    try {
      await repl.stopStandby();
      const unready = await until('/readyz to refuse', async () => {
        const r = await ready();
        return r.status === 503 ? r : undefined;
      });
      expect(unready.body).toMatchObject({ error: 'durability_unsafe', reasons: ['no_sync_standby_streaming'] });
      expect(unready.body.durability?.reasons).toEqual(['no_sync_standby_streaming']);

      const object = await put('/v1/objects/dur/http/2', '2', { 'fence-key': 'dur/http' }, 'two');
      expect(object.status).toBe(503);
      expect(object.headers.get('retry-after')).toBe('1');
      expect(await object.json()).toMatchObject({
        error: 'durability_unsafe',
        reasons: ['no_sync_standby_streaming'],
        message: expect.stringContaining('nothing committed') as unknown,
      });
      const del = await fetch(`${url}/v1/objects/dur/http/1`, {
        method: 'DELETE',
        headers: { 'fencing-token': '2', 'fence-key': 'dur/http' },
      });
      expect(del.status).toBe(503);
      const fence = await put('/v1/fences/dur-fence', '2');
      expect(fence.status).toBe(503);
      expect(((await fence.json()) as { error: string }).error).toBe('durability_unsafe');
      const tx = await transaction('tx-2', '2');
      expect(tx.status).toBe(503);
      expect(((await tx.json()) as { error: string }).error).toBe('durability_unsafe');
      // The SQL endpoint: the fenced session was ended, its next statement answered FP533; a new
      // session with a token is refused at startup; nothing of either applied.
      await expect(sql.query(`INSERT INTO public.ledger (id) VALUES ('sql-2')`)).rejects.toMatchObject({ code: DURABILITY_UNSAFE });
      await expect(sqlClient(fenceOptions(2, 'dur/sql'))).rejects.toMatchObject({ code: DURABILITY_UNSAFE });

      // Reads: HTTP, and a SQL session without a token.
      const read = await fetch(`${url}/v1/objects/dur/http/1`);
      expect(read.status).toBe(200);
      expect(await read.text()).toBe('one');
      expect((await fetch(`${url}/v1/objects/dur/http/2`)).status).toBe(404);
      expect(((await (await fetch(`${url}/v1/fences/dur-fence`)).json()) as { highestToken: string }).highestToken).toBe('1');
      expect((await reader.query<{ n: number }>('SELECT count(*)::int AS n FROM public.ledger')).rows[0]!.n).toBe(2);
      await expect(reader.query(`INSERT INTO public.ledger (id) VALUES ('reader')`)).rejects.toMatchObject({ code: '25006' });

      const text = await metricsText();
      expect(text).toContain('fencepost_fence_durability_unsafe{reason="no_sync_standby_streaming"} 1');
      expect(text).toContain('fencepost_fence_durability_refusing_writes 1');
      expect(text).toContain('fencepost_fence_durability_sync_standbys 0');
      expect(text).toContain('fencepost_writes_total{door="http",operation="put",outcome="error"} 1');
      // Counted alike on the SQL endpoint: the session refused at startup.
      expect(text).toContain('fencepost_writes_total{door="sql",operation="transaction",outcome="error"} 1');

      await repl.startStandby();
      await until('/readyz to be ready again', async () => ((await ready()).status === 200 ? true : undefined));
      expect((await put('/v1/objects/dur/http/2', '2', { 'fence-key': 'dur/http' }, 'two')).status).toBe(200);
      expect((await put('/v1/fences/dur-fence', '2')).status).toBe(200);
      expect((await transaction('tx-2', '2')).status).toBe(200);
      const again = await sqlClient(fenceOptions(2, 'dur/sql')); // a new session: fenced again
      await again.query(`INSERT INTO public.ledger (id) VALUES ('sql-2')`);
      await again.end();
      expect(await ledger()).toEqual(['sql-1', 'sql-2', 'tx-1', 'tx-2']);
      expect(await metricsText()).toContain('fencepost_fence_durability_refusing_writes 0');
    } finally {
      await sql.end().catch(() => {});
      await reader.end();
    }
    const changes = log.lines.filter((l) => l.component === 'durability' && l.reason === 'no_sync_standby_streaming');
    expect(changes.map((l) => l.level)).toEqual([40, 30]); // once unsafe, once cleared: not per check
  });

  test('a paused synchronous standby: a commit waiting on SyncRep is the reason waiting_on_standby', async () => {
    await repl.pauseStandby();
    const waiter = new pg.Client({ connectionString: repl.url });
    await waiter.connect();
    let committed: Promise<unknown> | undefined;
    try {
      committed = waiter.query(`INSERT INTO public.ledger (id) VALUES ('waiter')`);
      const unready = await until('waiting_on_standby', async () => {
        const r = await ready();
        return r.body.durability?.reasons.includes('waiting_on_standby') ? r : undefined;
      });
      expect(unready.status).toBe(503);
      expect(unready.body.durability?.waitingOnStandby).toBeGreaterThanOrEqual(1);
      const text = await metricsText();
      expect(text).toContain('fencepost_fence_durability_unsafe{reason="waiting_on_standby"} 1');
      expect(text).toMatch(/^fencepost_fence_durability_waiting_backends [1-9]/m);
      expect((await put('/v1/objects/dur/http/3', '3', { 'fence-key': 'dur/http' }, 'three')).status).toBe(503);
    } finally {
      await repl.resumeStandby();
      await committed;
      await waiter.end();
    }
    await until('/readyz to be ready again', async () => ((await ready()).status === 200 ? true : undefined));
    expect((await fetch(`${url}/v1/objects/dur/http/3`)).status).toBe(404);
    expect(await ledger()).toContain('waiter');
  });
});
