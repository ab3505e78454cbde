// The SQL endpoint says what happened when the backend connection goes: with a request of the
// writer's in flight (a Query or Sync with no ReadyForQuery yet: a COMMIT, or a statement of an
// implicit transaction, which commits at its end) the writer hears FATAL 08007
// transaction_resolution_unknown, its outcome unknown; with nothing in flight, FATAL 08006, and
// nothing of its open transaction lands. Either FATAL is the last message: the connection closes.
// libpq (psycopg2) shows a FATAL that came mid-request without a ReadyForQuery as the server
// closing the connection (OperationalError, no SQLSTATE), so the SQLSTATE is read with
// node-postgres. A real synchronous standby, stalled (its WAL receiver stopped), holds the commit
// in SyncRep; the network between the proxy and Postgres (tools/faults/tcp-proxy.ts) is cut
// meanwhile. The backend, committed locally, finishes once the standby resumes.
//
// (Terminating such a backend instead does not free the writer: Postgres warns and commits, then
// on its way out drops the session's temporary table, a commit of its own that waits for the
// standby again, with SIGTERM ignored, until the standby resumes.)
import { afterAll, afterEach, beforeAll, expect, test } from 'vitest';
import { spawn } from 'node:child_process';
import pg from 'pg';
import {
  stallStandby,
  drainSyncRep,
  startSynchronousDatabase,
  syncRepWaiters,
  type ReplicatedPostgres,
  type StalledStandby,
} from '../../support/replication.ts';
import { clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { fenceOptions, startSqlProxy, type SqlProxy } from '../../support/sql.ts';
import { TcpProxy } from '../../../tools/faults/tcp-proxy.ts';
import { message } from '../../../src/proxy/sql/wire/framing.ts';
import { B, E, P, Q, RawClient } from './raw-client.ts';

const PYTHON = '/usr/bin/python3';

let repl: ReplicatedPostgres;
let db: TestDatabase;
let sql: SqlProxy;
let stalled: StalledStandby | null = null;
let net: TcpProxy;

beforeAll(async () => {
  ({ repl, db } = await startSynchronousDatabase('fp_sql_commit_unknown', 'fp_cu_sql'));
  const url = db.url;
  const target = new URL(url);
  net = await TcpProxy.start({ targetHost: target.hostname, targetPort: Number(target.port) });
  const via = new URL(url);
  via.port = String(net.port);
  sql = await startSqlProxy({ ...db, url: via.toString() });
  await db.pool.query(`GRANT SELECT, INSERT ON public.items TO ${clientRoleFor(url)}`);
}, 120_000);

/** Resumes the standby and waits until no commit waits for it. */
async function resume(): Promise<void> {
  stalled?.resume();
  stalled = null;
  await drainSyncRep(db.pool);
}

afterEach(resume);

afterAll(async () => {
  stalled?.resume();
  // No commit may wait for the standby once it stops: a backend ending with temporary objects
  // (the session fence's, rule.ts) commits their removal, and would hold the primary's shutdown.
  await db?.pool.query("ALTER SYSTEM SET synchronous_standby_names = ''");
  await db?.pool.query('SELECT pg_reload_conf()');
  await sql?.close();
  await net?.close();
  await db?.pool.end();
  await repl?.stop();
});

const present = async (...ns: number[]) =>
  (await db.pool.query<{ id: number }>('SELECT id FROM public.items WHERE id = ANY($1) ORDER BY id', [ns])).rows.map((r) => r.id);

/** Cuts the proxy's connections to Postgres once a commit waits for the standby (so it is in flight). */
async function cutDuringCommit(): Promise<void> {
  await syncRepWaiters(db.url, 1);
  net.cut();
}

/**
 * Runs a psycopg2 program (argv[1]: the endpoint's URL). When it prints `ready` the standby is
 * stalled and the program told to go on; when it prints `waiting`, `then` runs. Resolves with the
 * lines it printed.
 */
function python(program: string, user: string, then: () => Promise<void>): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, ['-u', '-c', program, sql.url(user)], { stdio: ['pipe', 'pipe', 'pipe'] });
    const lines: string[] = [];
    let out = '';
    let err = '';
    const fail = (e: unknown) => {
      child.kill();
      reject(e instanceof Error ? e : new Error(String(e)));
    };
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      for (let nl = out.indexOf('\n'); nl >= 0; nl = out.indexOf('\n')) {
        const line = out.slice(0, nl);
        out = out.slice(nl + 1);
        lines.push(line);
        if (line === 'ready') {
          void stallStandby(repl).then((s) => {
            stalled = s;
            child.stdin.write('\n');
          }, fail);
        }
        if (line === 'waiting') void then().catch(fail);
      }
    });
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve(lines) : reject(new Error(`python exited ${code}: ${err}`))));
  });
}

test('node-postgres, simple protocol: a COMMIT whose backend connection is lost while it waits for the synchronous standby gets 08007, and the row is there', async () => {
  const client = await sql.connect('pg-commit', { options: fenceOptions(1, 'sqlcu/a') });
  try {
    await client.query('BEGIN');
    await client.query("INSERT INTO items VALUES (1, 'maybe')");
    stalled = await stallStandby(repl);
    const commit = client.query('COMMIT').then(
      () => null,
      (e: unknown) => e as { code?: string; severity?: string },
    );
    await cutDuringCommit();
    // An ERROR and a ReadyForQuery, then the connection closes: libpq keeps the SQLSTATE so.
    expect(await commit).toMatchObject({ code: '08007', severity: 'ERROR' });
  } finally {
    await client.end().catch(() => {});
  }
  await resume();
  expect(await present(1)).toEqual([1]);
}, 60_000);

test('psycopg2 in autocommit: a lone INSERT whose backend connection is lost during its implicit commit raises pgcode 08007, and the row is there', async () => {
  const program = `
import sys, psycopg2
conn = psycopg2.connect(sys.argv[1], options='${fenceOptions(1, 'sqlcu/b')}')
conn.autocommit = True
cur = conn.cursor()
cur.execute("SELECT 1")
print('ready')
sys.stdin.readline()
print('waiting')
try:
    cur.execute("INSERT INTO items VALUES (2, 'maybe')")
    print('committed')
except psycopg2.Error as e:
    print(e.pgcode)
try:
    cur.execute("SELECT 1")
    print('usable')
except psycopg2.Error:
    print('gone')
`;
  const lines = await python(program, 'py-auto', cutDuringCommit);
  expect(lines.slice(2)).toEqual(['08007', 'gone']);
  await resume();
  expect(await present(2)).toEqual([2]);
}, 60_000);

test('node-postgres, extended protocol: an autocommit INSERT whose backend connection is lost at its Sync gets 08007, and the next query hears the session is gone', async () => {
  const client = await sql.connect('pg-extended', { options: fenceOptions(1, 'sqlcu/c') });
  try {
    await client.query('SELECT 1');
    stalled = await stallStandby(repl);
    const insert = client.query('INSERT INTO items VALUES ($1, $2)', [3, 'maybe']).then(
      () => null,
      (e: unknown) => e as { code?: string },
    );
    await cutDuringCommit();
    expect((await insert)?.code).toBe('08007');
    const next = await client.query('SELECT 1').then(
      () => null,
      (e: unknown) => e as { code?: string; message?: string },
    );
    expect(next).not.toBeNull();
    expect(next?.code).not.toBe('08007');
  } finally {
    await client.end().catch(() => {});
  }
  await resume();
  expect(await present(3)).toEqual([3]);
}, 60_000);

test('a COMMIT executed with Flush, no Sync yet, whose backend connection is lost: 08007, and the row is there', async () => {
  const raw = await RawClient.connect(sql.port, sql.database, 'raw-flush', fenceOptions(1, 'sqlcu/f'));
  try {
    expect((await raw.send([Q("BEGIN; INSERT INTO items VALUES (5, 'maybe')")])).errors).toEqual([]);
    stalled = await stallStandby(repl);
    raw.write(P('COMMIT'), B(), E(), message('H'));
    await cutDuringCommit();
    const answer = await raw.read(1);
    expect(answer.errors).toEqual(['08007']);
    expect((await raw.read(1)).closed).toBe(true);
  } finally {
    raw.close();
  }
  await resume();
  expect(await present(5)).toEqual([5]);
}, 60_000);

test('a transaction whose backend connection is lost while the writer is idle in it: its next statement gets 08006, and its row never lands', async () => {
  const client = new pg.Client({ connectionString: sql.url('pg-idle', { options: fenceOptions(1, 'sqlcu/d') }) });
  client.on('error', () => {});
  await client.connect();
  try {
    await client.query('BEGIN');
    await client.query("INSERT INTO items VALUES (4, 'never')");
    net.cut();
    // Nothing was in flight: the COMMIT sent after the loss never reached Postgres.
    expect(
      await client.query('COMMIT').then(
        () => 'committed',
        (e: { code?: string }) => e.code,
      ),
    ).toBe('08006');
  } finally {
    await client.end().catch(() => {});
  }
  expect(await present(4)).toEqual([]);
}, 60_000);
