// The SQL endpoint's startup phase with real clients: refusals a client can read (after the
// SSLRequest is answered, as Postgres does), what a client may send in the same write as its
// startup packet, and the startup parameters the session keeps (application_name, timeouts).
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, type SqlProxy } from '../../support/sql.ts';
import { makeCert } from '../../support/tls.ts';

const run = promisify(execFile);
const PSQL = '/usr/bin/psql';
const dir = mkdtempSync(join(tmpdir(), 'fencepost-pgwire-startup-'));
const cert = makeCert(dir, 'startup');

/** psql's environment with libpq's defaults: no sslmode, no options from the caller's shell. */
function libpqDefaults(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, ...extra };
  for (const k of ['PGSSLMODE', 'PGOPTIONS', 'PGAPPNAME', 'PGPASSWORD', 'PGCONNECT_TIMEOUT']) if (!(k in extra)) delete env[k];
  return env;
}

const failure = (p: Promise<unknown>) => p.then(() => ({ stderr: '' }), (e: { stderr?: string }) => ({ stderr: e.stderr ?? String(e) }));

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
  rmSync(dir, { recursive: true, force: true });
});

describe('a full endpoint', () => {
  let plain: SqlProxy;
  let tls: SqlProxy;
  const held: pg.Client[] = [];
  beforeAll(async () => {
    plain = await startSqlProxy(db, { FENCEPOST_PGWIRE_MAX_CONNECTIONS: '1' });
    tls = await startSqlProxy(db, { FENCEPOST_PGWIRE_MAX_CONNECTIONS: '1', FENCEPOST_TLS_CERT: cert.cert, FENCEPOST_TLS_KEY: cert.key });
    held.push(await plain.connect('holder'));
    const c = new pg.Client({ connectionString: tls.url('holder'), ssl: { ca: cert.pem, servername: 'localhost' } });
    await c.connect();
    held.push(c);
  });
  afterAll(async () => {
    await Promise.all(held.map((c) => c.end().catch(() => {})));
    await plain?.close();
    await tls?.close();
  });

  // libpq's default sslmode=prefer sends an SSLRequest first: the refusal must come after it is
  // answered, or psql reports a failed SSL negotiation instead of the reason.
  test('psql with its default sslmode reads the 53300 refusal (no TLS configured: the SSLRequest is answered N)', async () => {
    const { stderr } = await failure(run(PSQL, [plain.url('refused'), '-X', '-c', 'SELECT 1'], { env: libpqDefaults() }));
    expect(stderr).toContain('too many connections to the fencepost SQL endpoint');
  });

  test('psql with its default sslmode reads the 53300 refusal over TLS (TLS configured: S, then the handshake)', async () => {
    const { stderr } = await failure(run(PSQL, [tls.url('refused'), '-X', '-c', 'SELECT 1'], { env: libpqDefaults() }));
    expect(stderr).toContain('too many connections to the fencepost SQL endpoint');
  });

  test('node-postgres (no SSLRequest) gets 53300 too', async () => {
    const c = new pg.Client({ connectionString: plain.url('refused') });
    c.on('error', () => {});
    expect(await c.connect().then(() => 'ok', (e: { code?: string }) => e.code)).toBe('53300');
  });
});
