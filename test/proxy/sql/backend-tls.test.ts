// A Postgres that accepts only TLS (hostssl in pg_hba.conf), as managed databases do: with
// DATABASE_URL's sslmode the SQL endpoint dials its backends over TLS and checks the certificate,
// as node-postgres does for the write path and /v1/transactions, so both doors reach it alike.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest';
import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Socket } from 'node:net';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import type { RunningPostgres } from '../../../src/fence/embedded-postgres.ts';
import { migrate } from '../../../src/fence/migrate.ts';
import { databaseTarget } from '../../../src/fence/database-url.ts';
import { BackendStartupError, openBackend } from '../../../src/proxy/sql/backend.ts';
import { closedPort, listenFree } from '../../../tools/ports.ts';
import { startPostgres } from '../../../tools/postgres.ts';
import { clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, sendCancel, type SqlProxy } from '../../support/sql.ts';

let dir: string;
let server: RunningPostgres;
let certFile: string;
let db: TestDatabase;
let sql: SqlProxy;
/** postgres://…/fp_tls?sslmode=verify-full&sslrootcert=…: TLS, the certificate checked against our own CA. */
let tlsUrl: string;
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string; message?: string }) => e.code ?? e.message ?? String(e),
  );

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'fencepost-backend-tls-'));
  chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
  certFile = join(dir, 'server.crt');
  const keyFile = join(dir, 'server.key');
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      keyFile,
      '-out',
      certFile,
      '-days',
      '2',
      '-subj',
      '/CN=localhost',
      '-addext',
      'subjectAltName=IP:127.0.0.1,DNS:localhost',
    ],
    { stdio: 'ignore' },
  );
  chmodSync(keyFile, 0o600); // Postgres refuses a key others can read
  if (userInfo().uid === 0) {
    const id = (flag: string) => Number(execFileSync('id', [flag, 'postgres']).toString().trim());
    for (const f of [keyFile, certFile]) chownSync(f, id('-u'), id('-g'));
  }
  server = await startPostgres({
    dataDir: join(dir, 'data'),
    postgresFlags: ['-c', 'ssl=on', '-c', `ssl_cert_file=${certFile}`, '-c', `ssl_key_file=${keyFile}`],
  });
  // TCP logins over TLS only.
  const hba = join(dir, 'data', 'pg_hba.conf');
  writeFileSync(hba, readFileSync(hba, 'utf8').replace(/^host(\s)/gm, 'hostssl$1'));
  const base = new URL(server.url);
  base.searchParams.set('sslmode', 'verify-full');
  base.searchParams.set('sslrootcert', certFile);
  const admin = new pg.Client({ connectionString: base.toString() });
  await admin.connect();
  await admin.query('SELECT pg_reload_conf()');
  await admin.query('CREATE DATABASE fp_tls');
  await admin.end();
  base.pathname = '/fp_tls';
  tlsUrl = base.toString();
  const pool = new pg.Pool({ connectionString: tlsUrl, max: 4 });
  pool.on('error', () => {});
  await migrate(pool);
  db = { url: tlsUrl, pool, drop: async () => await pool.end() };
  sql = await startSqlProxy(db);
  await pool.query('CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  await pool.query(`GRANT SELECT, INSERT ON public.items TO ${clientRoleFor(db.url)}`);
}, 60_000);

afterAll(async () => {
  await sql?.close();
  await db?.drop();
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('a database that accepts only TLS', () => {
  test('refuses a plain connection (the setup holds)', async () => {
    const plain = new URL(tlsUrl);
    plain.search = '';
    const c = new pg.Client({ connectionString: plain.toString() });
    c.on('error', () => {});
    expect(await code(c.connect())).toBe('28000'); // no pg_hba.conf entry without TLS
  });

  test('the SQL endpoint reaches it over TLS, and fences the session as ever', async () => {
    const c = await sql.connect('tls-writer', { options: fenceOptions(2, 'tls') });
    try {
      expect((await c.query('SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()')).rows).toEqual([{ ssl: true }]);
      await c.query("INSERT INTO items VALUES (1, 'over tls')");
    } finally {
      await c.end();
    }
    expect((await db.pool.query('SELECT v FROM public.items WHERE id = 1')).rows).toEqual([{ v: 'over tls' }]);
    expect(await fenceRow(db.pool, 'tls')).toEqual({ highest_token: '2' });
  });

  test('a cancel request reaches the backend over TLS too', async () => {
    const c = await sql.connect('tls-sleeper');
    const sleeping = code(c.query('SELECT pg_sleep(10)'));
    await new Promise((r) => setTimeout(r, 200));
    sendCancel(sql.port, c);
    expect(await sleeping).toBe('57014');
    await c.end();
  });

  test('/v1/transactions runs its client login over TLS', async () => {
    const r = await fetch(`${sql.proxy.url}/v1/transactions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        fences: [{ key: 'tls-tx', token: '1' }],
        statements: [
          { sql: 'SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()' },
          { sql: "INSERT INTO public.items VALUES (2, 'tx over tls')" },
        ],
      }),
    });
    expect(r.status).toBe(200);
    expect(((await r.json()) as { results: { rows: unknown[] }[] }).results[0]!.rows).toEqual([{ ssl: true }]);
    expect((await db.pool.query('SELECT v FROM public.items WHERE id = 2')).rows).toEqual([{ v: 'tx over tls' }]);
  });
});

describe('what the URL asks for is what the endpoint does', () => {
  const login = { user: 'fencepost', password: 'fencepost', parameters: new Map<string, string>(), settings: new Map<string, string>() };

  test('a certificate no trusted CA signed is refused with verify-full, as node-postgres refuses it', async () => {
    const noCa = new URL(tlsUrl);
    noCa.searchParams.delete('sslrootcert');
    const err = await openBackend(databaseTarget(noCa.toString()), login, 5000).then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/self[- ]signed certificate/i);
  });

  test('TLS asked of a server without it: refused, never downgraded to plain', async (ctx) => {
    const plainServer = new URL(inject('databaseUrl')); // the run's shared Postgres
    const probe = new pg.Client({ connectionString: plainServer.toString() });
    await probe.connect();
    const ssl = (await probe.query<{ ssl: string }>('SHOW ssl')).rows[0]!.ssl;
    await probe.end();
    if (ssl === 'on') ctx.skip(); // a DATABASE_URL server with TLS: nothing to refuse
    plainServer.searchParams.set('sslmode', 'no-verify');
    const err = await openBackend(databaseTarget(plainServer.toString()), login, 5000).then(
      () => null,
      (e: Error) => e,
    );
    expect(err).toBeInstanceOf(BackendStartupError);
    expect(err?.message).toMatch(/does not accept TLS/);
  });

  // A database host that accepts the connection and then says nothing (hung, or a black hole in
  // between): the dial gives up at its timeout and closes the connection, with TLS asked or not.
  test('a database that accepts and never answers: refused at the timeout, its connection closed', async () => {
    const open = new Set<Socket>();
    const silent = createServer((s) => {
      open.add(s);
      s.on('close', () => open.delete(s));
      s.on('error', () => {});
      s.resume(); // reads (and drops) what comes, so the client's close is seen
    });
    const port = await listenFree(silent);
    try {
      for (const query of ['?sslmode=no-verify', '']) {
        const started = Date.now();
        const err = await openBackend(databaseTarget(`postgresql://fp:pw@127.0.0.1:${port}/x${query}`), login, 300).then(
          () => null,
          (e: Error) => e,
        );
        expect(err, query).toBeInstanceOf(BackendStartupError);
        expect(Date.now() - started, query).toBeGreaterThanOrEqual(290);
        await expect.poll(() => open.size, { timeout: 5000, message: `connection left open (${query || 'plain'})` }).toBe(0);
      }
    } finally {
      silent.close();
    }
  });
});

describe('a DATABASE_URL listing several hosts, over TLS', () => {
  let multi: SqlProxy;
  beforeAll(async () => {
    // The first host is down; the second is the TLS-only server, its certificate checked for 127.0.0.1.
    const u = new URL(tlsUrl);
    const hosts = `127.0.0.1:${await closedPort()},127.0.0.1:${u.port}`;
    multi = await startSqlProxy(db, { DATABASE_URL: `${tlsUrl.replace(u.host, hosts)}&target_session_attrs=read-write` });
  });
  afterAll(async () => {
    await multi?.close();
  });

  test('the SQL endpoint dials the host picked over TLS, and a cancel reaches that host', async () => {
    const c = await multi.connect('tls-multi', { options: fenceOptions(3, 'tls-multi') });
    try {
      expect((await c.query('SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()')).rows).toEqual([{ ssl: true }]);
      await c.query("INSERT INTO items VALUES (3, 'picked over tls')");
      const sleeping = code(c.query('SELECT pg_sleep(10)'));
      await new Promise((r) => setTimeout(r, 200));
      sendCancel(multi.port, c);
      expect(await sleeping).toBe('57014');
    } finally {
      await c.end();
    }
    expect((await db.pool.query('SELECT v FROM public.items WHERE id = 3')).rows).toEqual([{ v: 'picked over tls' }]);
  });

  test('the write path and /v1/transactions reach it over TLS', async () => {
    const put = await fetch(`${multi.proxy.url}/v1/objects/tls-multi-1`, { method: 'PUT', headers: { 'fencing-token': '1' }, body: 'x' });
    expect(put.status).toBe(200);
    const r = await fetch(`${multi.proxy.url}/v1/transactions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        fences: [{ key: 'tls-multi-tx', token: '1' }],
        statements: [{ sql: 'SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()' }],
      }),
    });
    expect(r.status).toBe(200);
    expect(((await r.json()) as { results: { rows: unknown[] }[] }).results[0]!.rows).toEqual([{ ssl: true }]);
  });
});
