// Postgres failover warnings, each with its reason: asynchronous standbys and a server or database
// default of synchronous_commit below `on` can lose an acknowledged fence raise in a failover;
// synchronous_standby_names asking for more standbys than stream makes commits hang. They are
// reported at start and in GET /readyz, which stays ready (unless writes are refused for them:
// durability-monitor.test.ts).
import { portRangeEnv } from '../../tools/ports.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import { createTestDatabase, withDatabase, type TestDatabase } from '../support/db.ts';
import { testApp } from '../support/proxy.ts';
import { setSynchronousStandbyNames, startReplicatedPostgres, type ReplicatedPostgres } from '../support/replication.ts';
import pino from 'pino';
import { Writable } from 'node:stream';
import { createPool, startProxy } from '../../src/proxy/server.ts';
import { loadConfig } from '../../src/proxy/config.ts';
import { checkDurability } from '../../src/fence/durability.ts';

describe('on the test Postgres (no standbys)', () => {
  let db: TestDatabase;
  let pool: pg.Pool;
  const database = () => new URL(db.url).pathname.slice(1);
  beforeAll(async () => {
    db = await createTestDatabase({ poolSize: 2 });
    pool = createPool(db.url, 2); // the proxy's pool: forces synchronous_commit=on on its sessions
  });
  afterAll(async () => {
    await pool.end();
    await db.drop();
  });

  test('with the default synchronous_commit, the check warns of nothing', async () => {
    expect(await checkDurability(pool)).toEqual({
      warnings: [],
      reasons: [],
      standbys: [],
      synchronousCommit: 'on',
      synchronousStandbyNames: '',
      waitingOnStandby: 0,
    });
  });

  test("the proxy's own PGOPTIONS does not colour the report: it reads what other sessions get", async () => {
    const saved = process.env.PGOPTIONS;
    process.env.PGOPTIONS = '-c synchronous_commit=off';
    try {
      expect((await checkDurability(pool)).synchronousCommit).toBe('on');
    } finally {
      if (saved === undefined) delete process.env.PGOPTIONS;
      else process.env.PGOPTIONS = saved;
    }
  });

  test('GET /readyz answers 200 ready with the durability detail', async () => {
    const app = testApp(pool);
    try {
      const res = await app.inject({ method: 'GET', url: '/readyz' });
      expect(res.statusCode).toBe(200);
      expect(res.json()).toEqual({
        status: 'ready',
        durability: { warnings: [], reasons: [], standbys: [], synchronousCommit: 'on', synchronousStandbyNames: '', waitingOnStandby: 0 },
      });
    } finally {
      await app.close();
    }
  });

  test('a database default of synchronous_commit below on is warned about, though the proxy forces on for its own sessions', async () => {
    // Invariant: the check reads what other sessions get, not the value this proxy's pool forces.
    try {
      for (const value of ['off', 'local', 'remote_write']) {
        await db.pool.query(`ALTER DATABASE ${database()} SET synchronous_commit = ${value}`);
        const { rows } = await pool.query<{ synchronous_commit: string }>('SHOW synchronous_commit');
        expect(rows[0]!.synchronous_commit).toBe('on');
        const report = await checkDurability(pool);
        expect(report.synchronousCommit).toBe(value);
        expect(report.reasons).toEqual(['synchronous_commit_below_on']);
        expect(report.warnings[0]).toContain(`synchronous_commit is ${value}`);
        expect(report.warnings[0]).toContain(`database "${database()}"`);
      }
      const app = testApp(pool);
      try {
        const res = await app.inject({ method: 'GET', url: '/readyz' });
        expect(res.statusCode).toBe(200); // a warning, not unreadiness
        const body = res.json<{ status: string; durability: { warnings: string[]; synchronousCommit: string } }>();
        expect(body.status).toBe('ready');
        expect(body.durability.synchronousCommit).toBe('remote_write');
        expect(body.durability.warnings[0]).toMatch(/^synchronous_commit is remote_write/);
      } finally {
        await app.close();
      }
    } finally {
      await db.pool.query(`ALTER DATABASE ${database()} RESET synchronous_commit`);
    }
  });

  test('startProxy logs one warning per unsafe setting at start', async () => {
    const lines: { level: number; msg: string; component?: string }[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const line of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(line) as (typeof lines)[number]);
        done();
      },
    });
    try {
      await db.pool.query(`ALTER DATABASE ${database()} SET synchronous_commit = off`);
      const proxy = await startProxy(loadConfig({ DATABASE_URL: db.url, PORT: '0', ...portRangeEnv() }), pino({ level: 'warn' }, sink));
      await proxy.close();
    } finally {
      await db.pool.query(`ALTER DATABASE ${database()} RESET synchronous_commit`);
    }
    const warnings = lines.filter((l) => l.component === 'durability');
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatchObject({ level: 40, msg: expect.stringMatching(/^synchronous_commit is off/) as unknown });
  });

  test('remote_apply, stronger than on, is not warned about', async () => {
    try {
      await db.pool.query(`ALTER DATABASE ${database()} SET synchronous_commit = remote_apply`);
      expect((await checkDurability(pool)).warnings).toEqual([]);
    } finally {
      await db.pool.query(`ALTER DATABASE ${database()} RESET synchronous_commit`);
    }
  });
});

describe('with a real streaming standby', () => {
  let repl: ReplicatedPostgres;
  let admin: pg.Client;
  let pool: pg.Pool;
  beforeAll(async () => {
    repl = await startReplicatedPostgres('fp_standby');
    admin = new pg.Client({ connectionString: repl.url });
    await admin.connect();
    pool = createPool(repl.url, 2);
  });
  afterAll(async () => {
    await pool?.end();
    await admin?.end();
    await repl?.stop();
  });

  test('an asynchronous standby (synchronous_standby_names empty) is warned about by name', async () => {
    const report = await checkDurability(pool);
    expect(report.standbys).toEqual([{ name: 'fp_standby', state: 'streaming', syncState: 'async' }]);
    expect(report.synchronousStandbyNames).toBe('');
    expect(report.reasons).toEqual(['async_standby']);
    expect(report.warnings[0]).toMatch(/^asynchronous standby "fp_standby" \(synchronous_standby_names is empty\)/);
  });

  test('requiring a synchronous standby, an empty synchronous_standby_names is a reason of its own', async () => {
    const report = await checkDurability(pool, { requireSyncStandby: true });
    expect(report.reasons).toEqual(['async_standby', 'no_sync_standby']);
    expect(report.warnings[1]).toMatch(/^no synchronous standby: synchronous_standby_names is empty/);
  });

  test('a role that may not read pg_stat_replication in detail still gets the warning, with the sync state unknown', async () => {
    await admin.query(`CREATE ROLE fp_plain LOGIN PASSWORD 'fp_plain_password'`);
    const url = new URL(withDatabase(repl.url, 'postgres'));
    url.username = 'fp_plain';
    url.password = 'fp_plain_password';
    const plain = createPool(url.toString(), 1);
    try {
      const report = await checkDurability(plain);
      expect(report.standbys).toEqual([{ name: 'fp_standby', state: null, syncState: 'unknown' }]);
      expect(report.warnings).toHaveLength(1);
      expect(report.warnings[0]).toMatch(/^asynchronous standby "fp_standby" \(synchronous_standby_names is empty\)/);
    } finally {
      await plain.end();
    }
  });

  test('a standby that synchronous_standby_names covers (sync_state sync) is not warned about', async () => {
    await setSynchronousStandbyNames(repl, repl.standbyName, 'sync');
    const report = await checkDurability(pool);
    expect(report).toEqual({
      warnings: [],
      reasons: [],
      standbys: [{ name: 'fp_standby', state: 'streaming', syncState: 'sync' }],
      synchronousCommit: 'on',
      synchronousStandbyNames: 'fp_standby',
      waitingOnStandby: 0,
    });
  });

  test('a standby that synchronous_standby_names leaves out is warned about as asynchronous, and commits would hang', async () => {
    // Reads only: with no standby named here connected, commits would wait; this test commits nothing.
    await setSynchronousStandbyNames(repl, 'some_other_standby', 'async');
    const report = await checkDurability(pool);
    expect(report.standbys).toEqual([{ name: 'fp_standby', state: 'streaming', syncState: 'async' }]);
    expect(report.reasons).toEqual(['async_standby', 'no_sync_standby_streaming']);
    expect(report.warnings[0]).toMatch(/^asynchronous standby "fp_standby": /);
    expect(report.warnings[1]).toMatch(
      /^synchronous_standby_names is "some_other_standby" but no synchronous standby is streaming: every commit that waits for them .* hangs/,
    );
  });

  test('synchronous_standby_names asking for more synchronous standbys than stream: writes would hang', async () => {
    await setSynchronousStandbyNames(repl, `FIRST 2 (${repl.standbyName}, other)`, 'sync');
    const report = await checkDurability(pool);
    expect(report.reasons).toEqual(['no_sync_standby_streaming']);
    expect(report.warnings[0]).toContain('only 1 of the 2 synchronous standbys it asks for is streaming');
  });
});
