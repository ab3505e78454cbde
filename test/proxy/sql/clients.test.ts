// Real clients nobody here wrote, through the SQL endpoint: psql, pgbench (simple, extended,
// prepared) and psycopg2; and keys mode, where the password is the bearer key (SCRAM-SHA-256).
// A connection is fenced once, at startup: a stale token is refused then (libpq shows the FATAL's
// message), and a newer leader's raise ends a connection fenced at an older token.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { execFile } from 'node:child_process';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { uniqueRole } from '../../support/keys.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';

const run = promisify(execFile);
const PSQL = '/usr/bin/psql';
const PGBENCH = '/usr/bin/pgbench';
const PYTHON = '/usr/bin/python3';

let db: TestDatabase;
let sql: SqlProxy;
beforeAll(async () => {
  db = await createTestDatabase();
  sql = await startSqlProxy(db);
  await db.pool.query('CREATE TABLE public.counters (id int PRIMARY KEY, n bigint NOT NULL)');
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE ON public.counters TO ${clientRoleFor(db.url)}`);
});
afterAll(async () => {
  await sql?.close();
  await db?.drop();
});

const counter = async (id: number) =>
  (await db.pool.query<{ n: string }>('SELECT n::text FROM public.counters WHERE id = $1', [id])).rows[0]?.n;

describe('psql', () => {
  // libpq picks a server for target_session_attrs=read-write from the reported
  // default_transaction_read_only: off on a connection fenced at startup, on without a token.
  test('target_session_attrs=read-write takes the endpoint for a session with a token, not one without', async () => {
    const url = (user: string) => `${sql.url(user)}?target_session_attrs=read-write`;
    const withToken = await run(PSQL, [url('rw-writer'), '-X', '-v', 'ON_ERROR_STOP=1', '-c', 'INSERT INTO counters VALUES (40, 1)'], {
      env: { ...process.env, PGOPTIONS: fenceOptions(3, 'rw') },
    });
    expect(withToken.stdout).toContain('INSERT 0 1');
    expect(await counter(40)).toBe('1');
    const without = await run(PSQL, [url('rw-reader'), '-X', '-c', 'SELECT 1'], { env: { ...process.env, PGOPTIONS: '' } }).catch(
      (e: { stderr: string }) => e,
    );
    expect('stderr' in without ? without.stderr : '').toMatch(/read-only/);
    // Plain reads need no token and no attribute.
    expect(
      (await run(PSQL, [sql.url('reader'), '-X', '-At', '-c', 'SELECT 1'], { env: { ...process.env, PGOPTIONS: '' } })).stdout.trim(),
    ).toBe('1');
  });

  test('writes with PGOPTIONS; once the fence moved past its token, the connection is refused "stale fencing token" and writes nothing', async () => {
    const env = { ...process.env, PGOPTIONS: fenceOptions(7, 'psql') };
    const ok = await run(
      PSQL,
      [
        sql.url('psql-writer'),
        '-X',
        '-v',
        'ON_ERROR_STOP=1',
        '-c',
        'INSERT INTO counters VALUES (1, 1)',
        '-c',
        'BEGIN',
        '-c',
        'UPDATE counters SET n = n + 1 WHERE id = 1',
        '-c',
        'COMMIT',
      ],
      { env },
    );
    expect(ok.stdout).toContain('COMMIT');
    expect(await counter(1)).toBe('2');
    await fetch(`${sql.proxy.url}/v1/fences/psql`, { method: 'PUT', headers: { 'fencing-token': '8' } });
    const stale = await run(
      PSQL,
      [sql.url('psql-writer'), '-X', '-v', 'ON_ERROR_STOP=1', '-c', 'UPDATE counters SET n = n + 1 WHERE id = 1'],
      { env },
    ).catch((e: { stderr: string }) => e);
    // libpq shows a failed connection's message, not its SQLSTATE.
    expect((stale as { stderr: string }).stderr).toContain(
      'FATAL:  stale fencing token: token 7 is below the highest token 8 of fence key "psql"',
    );
    expect(await counter(1)).toBe('2');
  });
});

describe('pgbench', () => {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-pgbench-'));
  const script = join(dir, 'upsert.sql');
  writeFileSync(
    script,
    '\\set id random(100, 109)\nBEGIN;\nINSERT INTO counters VALUES (:id, 1) ON CONFLICT (id) DO UPDATE SET n = counters.n + 1;\nSELECT n FROM counters WHERE id = :id;\nEND;\nINSERT INTO counters VALUES (:id + 100, 1) ON CONFLICT (id) DO UPDATE SET n = counters.n + 1;\n',
  );
  for (const mode of ['simple', 'extended', 'prepared']) {
    test(`-M ${mode}: every transaction commits under the writer's token`, async () => {
      const env = { ...process.env, PGOPTIONS: fenceOptions(3, `bench-${mode}`) };
      // The leader raises its fence once (as a new leader does); then its writers share it.
      expect((await fetch(`${sql.proxy.url}/v1/fences/bench-${mode}`, { method: 'PUT', headers: { 'fencing-token': '3' } })).status).toBe(
        200,
      );
      const before = Number(
        (await db.pool.query<{ s: string }>('SELECT coalesce(sum(n), 0)::text AS s FROM public.counters WHERE id >= 100')).rows[0]!.s,
      );
      const { stdout } = await run(PGBENCH, ['-n', '-M', mode, '-c', '4', '-t', '50', '-f', script, sql.url('bench')], { env });
      expect(stdout).toContain('number of failed transactions: 0');
      const after = Number(
        (await db.pool.query<{ s: string }>('SELECT coalesce(sum(n), 0)::text AS s FROM public.counters WHERE id >= 100')).rows[0]!.s,
      );
      expect(after - before).toBe(4 * 50 * 2);
      expect(await fenceRow(db.pool, `bench-${mode}`)).toEqual({ highest_token: '3' });
    }, 60_000);
  }
});

describe('psycopg2', () => {
  test("writes in its implicit transactions; a newer leader's raise ends its connection: FP409 as a pgcode, nothing lands, a reconnect at the old token is refused", async () => {
    const program = `
import sys, psycopg2
conn = psycopg2.connect(sys.argv[1], options='${fenceOptions(5, 'py')}')
cur = conn.cursor()
cur.execute("INSERT INTO counters VALUES (%s, %s)", (300, 1))
conn.commit()
cur.execute("SELECT current_setting('fencepost.token')")
print(cur.fetchone()[0])
conn.commit()
import urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[2], method='PUT', headers={'Fencing-Token': '6'}))
try:
    cur.execute("UPDATE counters SET n = n + 1 WHERE id = 300")
    conn.commit()
    print('committed')
except psycopg2.Error as e:
    print(e.pgcode)
try:
    psycopg2.connect(sys.argv[1], options='${fenceOptions(5, 'py')}')
    print('connected')
except psycopg2.OperationalError as e:
    print('stale fencing token: token 5 is below the highest token 6' in str(e))
`;
    const { stdout } = await run(PYTHON, ['-c', program, sql.url('py-writer'), `${sql.proxy.url}/v1/fences/py`]);
    expect(stdout.trim().split('\n')).toEqual(['5', 'FP409', 'True']);
    expect(await counter(300)).toBe('1');
  });
});

describe('keys mode', () => {
  let keyed: SqlProxy;
  const role = uniqueRole('sqlkey');
  beforeAll(async () => {
    await db.pool.query(`CREATE ROLE ${role} NOLOGIN`);
    await db.pool.query(`GRANT SELECT, INSERT, UPDATE ON public.counters TO ${role}`);
    const keys = JSON.stringify([
      { name: 'orders-writer', secret: 'orders-secret-0123456789', fenceKeyPrefixes: ['orders/'], pgRole: role },
    ]);
    keyed = await startSqlProxy(db, { FENCEPOST_KEYS: keys, FENCEPOST_READ_ACCESS: 'key' });
  });
  afterAll(async () => {
    await keyed?.close();
  });
  const code = (p: Promise<unknown>) =>
    p.then(
      () => 'ok',
      (e: { code?: string }) => e.code ?? String(e),
    );

  test('the key logs in with SCRAM-SHA-256 and writes under its prefixes as its pgRole', async () => {
    const c = await keyed.connect('orders-writer', { password: 'orders-secret-0123456789', options: fenceOptions(1, 'orders/1') });
    await c.query('INSERT INTO counters VALUES ($1, 1)', [400]);
    expect((await c.query('SELECT current_user AS u')).rows[0].u).toBe(role);
    await c.query('SET ROLE NONE');
    expect(await code(c.query('INSERT INTO counters VALUES (401, 1)'))).toBe('42501'); // the login itself may not write
    await c.query('RESET ROLE'); // back to the startup role: the key's pgRole
    expect((await c.query('SELECT current_user AS u')).rows[0].u).toBe(role);
    await c.end();
    expect(await counter(400)).toBe('1');
  });

  test("a fence key outside the key's prefixes is refused at connect (42501), also where a fence at the very token exists; nothing counted", async () => {
    // (The prefixes are checked before the fence: a connection at the fence's own token is no exception.)
    await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ('invoices/1', 1)`);
    await expect(
      keyed.connect('orders-writer', { password: 'orders-secret-0123456789', options: fenceOptions(1, 'invoices/1') }),
    ).rejects.toMatchObject({ code: '42501', message: expect.stringContaining('outside its fence-key prefixes') });
    expect((await db.pool.query(`SELECT 1 FROM fencepost.pending_counts WHERE fence_key = 'invoices/1'`)).rowCount).toBe(0);
    expect(await fenceRow(db.pool, 'invoices/1')).toEqual({ highest_token: '1' });
  });

  test('a wrong password, an unknown key or psql with PGPASSWORD', async () => {
    expect(await code(keyed.connect('orders-writer', { password: 'wrong-secret-0123456789' }))).toBe('28P01');
    expect(await code(keyed.connect('nobody', { password: 'orders-secret-0123456789' }))).toBe('28P01');
    const { stdout } = await run(PSQL, [keyed.url('orders-writer'), '-X', '-At', '-c', 'SHOW fencepost.fence_key'], {
      env: { ...process.env, PGPASSWORD: 'orders-secret-0123456789', PGOPTIONS: fenceOptions(2, 'orders/2') },
    });
    expect(stdout.trim()).toBe('orders/2');
  });
});
