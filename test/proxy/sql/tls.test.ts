// TLS on the SQL endpoint (FENCEPOST_TLS_CERT / _KEY, the proxy's certificate): SSLRequest is
// answered 'S' and the session runs over TLS, with real clients (psql sslmode=require,
// node-postgres ssl); plaintext sessions are refused; bytes sent after the SSLRequest before the
// handshake are refused (CVE-2021-23222 class); a reloaded certificate serves new sessions. A
// stale token's refusal at startup reaches the client over TLS.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { connect as tcp } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';
import { makeCert as makeTlsCert, replaceFile } from '../../support/tls.ts';

const run = promisify(execFile);
const PSQL = '/usr/bin/psql';
const dir = mkdtempSync(join(tmpdir(), 'fencepost-pgwire-tls-'));

const makeCert = (name: string) => makeTlsCert(dir, name);

const first = makeCert('first');
const second = makeCert('second');
const live = { cert: join(dir, 'live.cert.pem'), key: join(dir, 'live.key.pem') };
replaceFile(first.cert, live.cert);
replaceFile(first.key, live.key);

let db: TestDatabase;
let sql: SqlProxy;
const role = `sqltls_${Math.random().toString(36).slice(2, 10)}`;
const SECRET = 'tls-orders-secret-0123456789';
const HASHED_SECRET = 'tls-hashed-secret-0123456789';
let keyed: SqlProxy;
let keysJson = '';

beforeAll(async () => {
  db = await createTestDatabase();
  sql = await startSqlProxy(db, { FENCEPOST_TLS_CERT: live.cert, FENCEPOST_TLS_KEY: live.key });
  await db.pool.query('CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON public.items TO ${clientRoleFor(db.url)}`);
  await db.pool.query(`CREATE ROLE ${role} NOLOGIN`);
  await db.pool.query(`GRANT SELECT, INSERT ON public.items TO ${role}`);
  keysJson = JSON.stringify([
    { name: 'orders-writer', secret: SECRET, fenceKeyPrefixes: ['orders/'], pgRole: role },
    {
      name: 'hashed-writer',
      secretSha256: createHash('sha256').update(HASHED_SECRET).digest('hex'),
      fenceKeyPrefixes: ['orders/'],
      pgRole: role,
    },
  ]);
  keyed = await startSqlProxy(db, {
    FENCEPOST_TLS_CERT: first.cert,
    FENCEPOST_TLS_KEY: first.key,
    FENCEPOST_KEYS: keysJson,
    FENCEPOST_READ_ACCESS: 'key',
  });
});
afterAll(async () => {
  await sql?.close();
  await keyed?.close();
  await db?.drop();
  rmSync(dir, { recursive: true, force: true });
});

let nextId = 1;
const id = () => nextId++;
const exists = async (n: number) => (await db.pool.query('SELECT 1 FROM public.items WHERE id = $1', [n])).rowCount === 1;
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );

async function plainClient(proxy: SqlProxy, user: string, password: string, options?: string): Promise<pg.Client> {
  const c = new pg.Client({
    host: '127.0.0.1',
    port: proxy.port,
    database: proxy.database,
    user,
    password,
    ...(options !== undefined ? { options } : {}),
  });
  c.on('error', () => {});
  await c.connect();
  return c;
}

async function tlsClient(
  proxy: SqlProxy,
  user: string,
  opts: { password?: string; options?: string; ssl?: pg.ClientConfig['ssl'] } = {},
): Promise<pg.Client> {
  const c = new pg.Client({
    host: '127.0.0.1',
    port: proxy.port,
    database: proxy.database,
    user,
    ...(opts.password !== undefined ? { password: opts.password } : {}),
    ...(opts.options !== undefined ? { options: opts.options } : {}),
    ssl: opts.ssl ?? { ca: [first.pem, second.pem], servername: 'localhost' },
  });
  c.on('error', () => {});
  await c.connect();
  return c;
}

/** The certificate the endpoint showed this client. */
const peerFingerprint = (c: pg.Client) =>
  (c as unknown as { connection: { stream: TLSSocket } }).connection.stream.getPeerCertificate().fingerprint256;

describe('TLS on the SQL endpoint', () => {
  test('node-postgres (verifying the certificate, and with rejectUnauthorized: false) writes fenced over TLS', async () => {
    const c = await tlsClient(sql, 'tls-writer', { options: fenceOptions(3, 'tls/a') });
    expect(peerFingerprint(c)).toBe(first.fingerprint);
    const x = id();
    await c.query('INSERT INTO items VALUES ($1, $2)', [x, 'extended over tls']);
    const y = id();
    await c.query(`INSERT INTO items VALUES (${y}, 'simple over tls')`);
    expect([await exists(x), await exists(y)]).toEqual([true, true]);
    expect(await fenceRow(db.pool, 'tls/a')).toEqual({ highest_token: '3' });
    await c.end();
    const loose = await tlsClient(sql, 'tls-writer', { options: fenceOptions(3, 'tls/a'), ssl: { rejectUnauthorized: false } });
    await loose.query('INSERT INTO items VALUES ($1, $2)', [id(), 'unverified certificate']);
    await loose.end();
  });

  test('psql with sslmode=require writes fenced; a stale token over TLS is refused at connect ("stale fencing token"), nothing written', async () => {
    const env = { ...process.env, PGOPTIONS: fenceOptions(4, 'tls/psql'), PGSSLMODE: 'require' };
    const x = id();
    const ok = await run(
      PSQL,
      [sql.url('psql-tls'), '-X', '-At', '-v', 'ON_ERROR_STOP=1', '-c', `INSERT INTO items VALUES (${x}, 'psql')`, '-c', '\\conninfo'],
      { env },
    );
    expect(ok.stdout).toMatch(/SSL connection|SSL.*true|TLS/i);
    expect(await exists(x)).toBe(true);
    expect(await fenceRow(db.pool, 'tls/psql')).toEqual({ highest_token: '4' });
    await db.pool.query("UPDATE fencepost.fences SET highest_token = 5 WHERE fence_key = 'tls/psql'"); // a new leader's raise
    const y = id();
    const stale = await run(PSQL, [sql.url('psql-tls'), '-X', '-v', 'ON_ERROR_STOP=1', '-c', `INSERT INTO items VALUES (${y}, 'stale')`], {
      env,
    }).catch((e: { stderr: string }) => e);
    // libpq shows a failed connection's message, not its SQLSTATE.
    expect((stale as { stderr: string }).stderr).toContain(
      'FATAL:  stale fencing token: token 4 is below the highest token 5 of fence key "tls/psql"',
    );
    expect(await exists(y)).toBe(false);
  });

  test('a plaintext session is refused when TLS is configured (psql sslmode=disable, node-postgres without ssl)', async () => {
    const env = { ...process.env, PGSSLMODE: 'disable' };
    const err = await run(PSQL, [sql.url('plain'), '-X', '-c', 'SELECT 1'], { env }).catch((e: { stderr: string }) => e);
    expect((err as { stderr: string }).stderr).toMatch(/requires TLS/);
    expect(await code(sql.connect('plain'))).toBe('28000');
  });

  test('bytes sent after the SSLRequest, before the handshake, are refused and never read as the session', async () => {
    const sslRequest = Buffer.alloc(8);
    sslRequest.writeInt32BE(8, 0);
    sslRequest.writeInt32BE(80877103, 4);
    const params = Buffer.from(`user\u0000injected\u0000database\u0000${sql.database}\u0000\u0000`);
    const startup = Buffer.alloc(8);
    startup.writeInt32BE(8 + params.length, 0);
    startup.writeInt32BE(196608, 4);
    const reply = await new Promise<Buffer>((resolve, reject) => {
      const s = tcp({ host: '127.0.0.1', port: sql.port });
      const got: Buffer[] = [];
      s.on('data', (b) => got.push(b));
      s.on('error', reject);
      s.on('close', () => resolve(Buffer.concat(got)));
      s.on('connect', () => s.write(Buffer.concat([sslRequest, startup, params])));
      setTimeout(() => s.destroy(), 5000);
    });
    expect(reply.subarray(0, 1).toString()).toBe('E'); // not 'S': no handshake, the connection is closed
    expect(reply.toString('latin1')).toMatch(/unencrypted data after SSL request/);
    expect(reply.toString('latin1')).toContain('08P01');
  });

  test('keys mode over TLS: SCRAM for a key with secret, a cleartext password only for a secretSha256 key', async () => {
    const c = await tlsClient(keyed, 'orders-writer', { password: SECRET, options: fenceOptions(1, 'orders/tls') });
    await c.query('INSERT INTO items VALUES ($1, $2)', [id(), 'scram over tls']);
    await c.end();
    const h = await tlsClient(keyed, 'hashed-writer', { password: HASHED_SECRET, options: fenceOptions(1, 'orders/tls') });
    const x = id();
    await h.query('INSERT INTO items VALUES ($1, $2)', [x, 'cleartext over tls']);
    expect(await exists(x)).toBe(true);
    await h.end();
    expect(await code(tlsClient(keyed, 'hashed-writer', { password: 'wrong-secret-0123456789' }))).toBe('28P01');
    expect(await code(tlsClient(keyed, 'orders-writer', { password: 'wrong-secret-0123456789' }))).toBe('28P01');
  });

  test('without TLS a secretSha256 key is refused in one line saying it needs TLS; a key with a secret logs in with SCRAM', async () => {
    const plain = await startSqlProxy(db, { FENCEPOST_KEYS: keysJson, FENCEPOST_READ_ACCESS: 'key' });
    try {
      const refused = await plainClient(plain, 'hashed-writer', HASHED_SECRET).then(
        () => null,
        (e: { code?: string; message: string; hint?: string }) => e,
      );
      expect(refused?.code).toBe('28000');
      expect(refused?.message).toBe(
        'key "hashed-writer" can log in to the SQL endpoint over TLS only: it keeps only secretSha256, which SCRAM cannot use',
      );
      expect((refused as { detail?: string } | null)?.detail).toContain('sslmode=require');
      const c = await plainClient(plain, 'orders-writer', SECRET, fenceOptions(1, 'orders/plain'));
      await c.query('INSERT INTO items VALUES ($1, $2)', [id(), 'scram without tls']);
      await c.end();
      expect(await code(plainClient(plain, 'orders-writer', 'wrong-secret-0123456789'))).toBe('28P01');
    } finally {
      await plain.close();
    }
  });

  test('after a reload (what SIGHUP runs) new sessions get the new certificate; a session already up keeps working', async () => {
    const old = await tlsClient(sql, 'reload-writer', { options: fenceOptions(1, 'tls/reload') });
    expect(peerFingerprint(old)).toBe(first.fingerprint);
    replaceFile(second.cert, live.cert);
    replaceFile(second.key, live.key);
    expect(sql.proxy.reloadTls()).toBe(true);
    const fresh = await tlsClient(sql, 'reload-writer', { options: fenceOptions(1, 'tls/reload') });
    expect(peerFingerprint(fresh)).toBe(second.fingerprint);
    expect(sql.proxy.tls?.fingerprint()).toBe(second.fingerprint);
    await fresh.query('INSERT INTO items VALUES ($1, $2)', [id(), 'new certificate']);
    await old.query('INSERT INTO items VALUES ($1, $2)', [id(), 'old certificate']);
    await Promise.all([old.end(), fresh.end()]);
  });
});
