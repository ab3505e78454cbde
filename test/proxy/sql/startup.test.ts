// The SQL endpoint's startup phase with real clients: refusals a client can read (after the
// SSLRequest is answered, as Postgres does), what a client may send in the same write as its
// startup packet, a stale token's refusal, and the startup parameters the session keeps
// (application_name, timeouts, the fencepost settings that fence the connection).
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { execFile } from 'node:child_process';
import { connect as tcp } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { fenceOptions, startSqlProxy, type SqlProxy } from '../../support/sql.ts';
import { makeCert } from '../../support/tls.ts';
import { message } from '../../../src/proxy/sql/wire/framing.ts';
import { parseErrorFields } from '../../../src/proxy/sql/wire/backend.ts';
import { PROTOCOL_3_0 } from '../../../src/proxy/sql/wire/frontend.ts';

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

const failure = (p: Promise<unknown>) =>
  p.then(
    () => ({ stderr: '' }),
    (e: { stderr?: string }) => ({ stderr: e.stderr ?? String(e) }),
  );

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
    expect(
      await c.connect().then(
        () => 'ok',
        (e: { code?: string }) => e.code,
      ),
    ).toBe('53300');
  });
});

const startupPacket = (user: string, database: string) => message('', PROTOCOL_3_0, 'user', user, 'database', database, Buffer.from([0]));
const TERMINATE = message('X');

interface RawOutcome {
  /** The server's messages by type, in order ('R0' for AuthenticationOk, 'R10' for SASL, …). */
  types: string[];
  errors: Map<string, string>[];
  /** The server closed the connection (rather than the test's own deadline ending it). */
  closedByServer: boolean;
  /** Bytes of `flood` the client managed to write before the server closed. */
  floodWritten: number;
}

/**
 * A raw client: writes `first`, answers each server message with `reply` (if it returns bytes),
 * and once `floodAfter` says so writes `flood` in 64 KiB pieces as fast as the server reads
 * them, until the server closes or `maxMs` passes.
 */
function rawClient(
  port: number,
  first: Buffer,
  opts: { reply?: (type: string) => Buffer | null; flood?: number; floodAfter?: (type: string) => boolean; maxMs?: number } = {},
): Promise<RawOutcome> {
  return new Promise((resolve) => {
    const sock = tcp({ host: '127.0.0.1', port });
    const out: RawOutcome = { types: [], errors: [], closedByServer: false, floodWritten: 0 };
    let buf = Buffer.alloc(0);
    let flooding = false;
    const timer = setTimeout(() => sock.destroy(), opts.maxMs ?? 10_000);
    const piece = Buffer.alloc(64 * 1024, 0x61);
    const flood = () => {
      flooding = true;
      while (!sock.destroyed && out.floodWritten < (opts.flood ?? 0)) {
        out.floodWritten += piece.length;
        if (!sock.write(piece)) {
          sock.once('drain', flood);
          return;
        }
      }
    };
    sock.on('error', () => {});
    sock.on('end', () => (out.closedByServer = true));
    sock.on('close', () => {
      clearTimeout(timer);
      resolve(out);
    });
    sock.on('connect', () => {
      sock.write(first);
      if (opts.floodAfter === undefined && opts.flood) flood();
    });
    sock.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 5 && buf.length >= 1 + buf.readInt32BE(1)) {
        const type = String.fromCharCode(buf[0]!);
        const body = buf.subarray(5, 1 + buf.readInt32BE(1));
        buf = buf.subarray(1 + buf.readInt32BE(1));
        const name = type === 'R' ? `R${body.readInt32BE(0)}` : type;
        out.types.push(name);
        if (type === 'E') out.errors.push(parseErrorFields(body));
        const answer = opts.reply?.(name);
        if (answer) sock.write(answer);
        if (!flooding && opts.floodAfter?.(name)) flood();
      }
    });
  });
}

describe('what a client sends with its startup packet', () => {
  let open: SqlProxy;
  let keyed: SqlProxy;
  beforeAll(async () => {
    open = await startSqlProxy(db);
    keyed = await startSqlProxy(db, {
      FENCEPOST_KEYS: JSON.stringify([{ name: 'k', secret: 'startup-secret-0123456789', readOnly: true }]),
      FENCEPOST_READ_ACCESS: 'key',
    });
  });
  afterAll(async () => {
    await open?.close();
    await keyed?.close();
  });

  // Bytes after the startup packet are the session's next messages, not part of the packet.
  test('a startup packet and Terminate in one write: the session starts, then ends at the Terminate, no error', async () => {
    const got = await rawClient(open.port, Buffer.concat([startupPacket('one-write', open.database), TERMINATE]));
    expect(got.errors).toEqual([]);
    expect(got.types).toContain('R0');
    expect(got.types.at(-1)).toBe('Z');
    expect(got.closedByServer).toBe(true);
  });

  test('with keys, Terminate where the SASL response was due ends the connection quietly', async () => {
    const got = await rawClient(keyed.port, Buffer.concat([startupPacket('k', keyed.database), TERMINATE]));
    expect([got.types, got.closedByServer]).toEqual([['R10'], true]);
  });
});

describe('message size bounds during startup', () => {
  let keyed: SqlProxy;
  const MIB_64 = 64 * 1024 * 1024;
  beforeAll(async () => {
    keyed = await startSqlProxy(db, {
      FENCEPOST_KEYS: JSON.stringify([{ name: 'k', secret: 'bounds-secret-0123456789', readOnly: true }]),
      FENCEPOST_READ_ACCESS: 'key',
    });
  });
  afterAll(async () => {
    await keyed?.close();
  });

  const healthz = async () => (await fetch(`${keyed.proxy.url}/healthz`)).status;

  // A length is checked when its 4 bytes are in: the proxy never buffers toward a 64 MiB packet.
  test('a startup packet announcing 64 MiB is refused with 08P01 and closed before the client could send it', async () => {
    const head = Buffer.alloc(8);
    head.writeInt32BE(MIB_64, 0);
    head.writeInt32BE(PROTOCOL_3_0, 4);
    const [got, status] = await Promise.all([rawClient(keyed.port, head, { flood: MIB_64 }), healthz()]);
    expect(got.errors.map((e) => [e.get('C'), e.get('M')])).toEqual([['08P01', expect.stringContaining('invalid startup packet')]]);
    expect(got.closedByServer).toBe(true);
    expect(got.floodWritten).toBeLessThan(MIB_64);
    expect(status).toBe(200);
  });

  test('a SASL response announcing 64 MiB is refused with 08P01 and closed before the client could send it', async () => {
    const head = Buffer.alloc(5);
    head.write('p', 0, 'latin1');
    head.writeInt32BE(MIB_64, 1);
    const got = await rawClient(keyed.port, startupPacket('k', keyed.database), {
      reply: (t) => (t === 'R10' ? head : null),
      flood: MIB_64,
      floodAfter: (t) => t === 'R10',
    });
    expect(got.errors.map((e) => [e.get('C'), e.get('M')])).toEqual([['08P01', expect.stringContaining('invalid authentication message')]]);
    expect(got.closedByServer).toBe(true);
    expect(got.floodWritten).toBeLessThan(MIB_64);
    expect(await healthz()).toBe(200);
  });

  test('six connections flooding oversized SASL responses at once leave /healthz answering and every one closed', async () => {
    const head = Buffer.alloc(5);
    head.write('p', 0, 'latin1');
    head.writeInt32BE(MIB_64, 1);
    const floods = Promise.all(
      Array.from({ length: 6 }, () =>
        rawClient(keyed.port, startupPacket('k', keyed.database), {
          reply: (t) => (t === 'R10' ? head : null),
          flood: MIB_64,
          floodAfter: (t) => t === 'R10',
        }),
      ),
    );
    expect(await healthz()).toBe(200);
    const all = await floods;
    expect(all.map((g) => g.closedByServer)).toEqual(Array(6).fill(true));
    expect(all.every((g) => g.floodWritten < MIB_64)).toBe(true);
  });
});

describe('startup parameters the session keeps', () => {
  let sql: SqlProxy;
  beforeAll(async () => {
    // The proxy's own bounds: statement timeout 4 s, lock timeout 1.5 s.
    sql = await startSqlProxy(db, { FENCEPOST_TX_STATEMENT_TIMEOUT_MS: '4000', FENCEPOST_LOCK_TIMEOUT_MS: '1500' });
  });
  afterAll(async () => {
    await sql?.close();
  });

  const ownRow = 'SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()';
  const psql = async (user: string, sqlText: string, env: Record<string, string> = {}) =>
    (await run(PSQL, [sql.url(user), '-X', '-At', '-c', sqlText], { env: libpqDefaults(env) })).stdout.trim();
  const nodePg = async (config: pg.ClientConfig, sqlText: string) => {
    const c = new pg.Client({ connectionString: sql.url('node-writer'), ...config });
    await c.connect();
    try {
      return Object.values((await c.query(sqlText)).rows[0] as Record<string, unknown>)[0];
    } finally {
      await c.end();
    }
  };

  // What the writer named itself is what pg_stat_activity shows for its backend.
  test("application_name: psql's PGAPPNAME and its default, node-postgres's (also as fallback_application_name), psycopg2's reach pg_stat_activity", async () => {
    expect(await psql('w', ownRow, { PGAPPNAME: 'orders-service' })).toBe('orders-service');
    expect(await psql('w', ownRow)).toBe('psql');
    expect(await nodePg({ application_name: 'billing' }, ownRow)).toBe('billing');
    expect(await nodePg({ fallback_application_name: 'billing-fallback' }, ownRow)).toBe('billing-fallback');
    const program = `import sys, psycopg2
conn = psycopg2.connect(sys.argv[1], application_name='py-app')
cur = conn.cursor()
cur.execute(sys.argv[2])
print(cur.fetchone()[0])`;
    expect((await run('/usr/bin/python3', ['-c', program, sql.url('py'), ownRow])).stdout.trim()).toBe('py-app');
  });

  // Invariant: a startup setting reaches Postgres as it would straight, unless the proxy decides it
  // itself (startup.ts OWN_SETTINGS); the fence's own settings fence the session whichever way they come.
  test('other startup settings reach Postgres: psql PGOPTIONS -c work_mem, asyncpg server_settings (parameters of their own)', async () => {
    expect(await psql('w', 'SHOW work_mem', { PGOPTIONS: '-c work_mem=8MB' })).toBe('8MB');
    const program = `import asyncio, sys, asyncpg
async def main():
    c = await asyncpg.connect(sys.argv[1], server_settings={'work_mem': '8MB', 'myapp.tenant': 'acme', 'default_transaction_read_only': 'off'})
    print(await c.fetchval('SHOW work_mem'), await c.fetchval("SELECT current_setting('myapp.tenant')"), await c.fetchval('SHOW default_transaction_read_only'))
    await c.close()
asyncio.run(main())`;
    // default_transaction_read_only is the proxy's (a tokenless session stays read-only).
    expect((await run('/usr/bin/python3', ['-c', program, sql.url('asyncpg-w')])).stdout.trim()).toBe('8MB acme on');
  });

  test("fencepost.token and fencepost.fence_key as startup parameters of the driver's own (asyncpg server_settings) fence the session", async () => {
    const program = `import asyncio, sys, asyncpg
async def main():
    c = await asyncpg.connect(sys.argv[1], server_settings={'fencepost.token': '3', 'fencepost.fence_key': 'startup/asyncpg'})
    async with c.transaction():
        await c.fetchval('SELECT 1')
    await c.close()
asyncio.run(main())`;
    await run('/usr/bin/python3', ['-c', program, sql.url('asyncpg-fenced')]);
    const { rows } = await db.pool.query(`SELECT highest_token::text AS t FROM fencepost.fences WHERE fence_key = 'startup/asyncpg'`);
    expect(rows).toEqual([{ t: '3' }]);
  });

  // Invariant: a token below the fence's highest never gets a session: the refusal is the answer to
  // the startup, each client reads it, and the fence and its leader's connection stay as they were.
  test('a stale token is refused at startup with FATAL FP409, read by node-postgres, psql and psycopg2; the fence does not move', async () => {
    const fenceKey = 'startup/stale';
    const leader = await sql.connect('stale-leader', { options: fenceOptions(7, fenceKey) });
    const message = `stale fencing token: token 6 is below the highest token 7 of fence key "${fenceKey}"`;
    const c = new pg.Client({ connectionString: sql.url('stale-node', { options: fenceOptions(6, fenceKey) }) });
    c.on('error', () => {});
    const err = (await c.connect().catch((e: pg.DatabaseError) => e)) as pg.DatabaseError;
    expect(err).toMatchObject({ code: 'FP409', severity: 'FATAL', message, detail: `fence key "${fenceKey}", token 6, highest token 7` });
    // libpq shows a connection failure's message, not its SQLSTATE.
    const { stderr } = await failure(
      run(PSQL, [sql.url('stale-psql'), '-X', '-c', 'SELECT 1'], { env: libpqDefaults({ PGOPTIONS: fenceOptions(6, fenceKey) }) }),
    );
    expect(stderr).toContain(`FATAL:  ${message}`);
    const program = `import sys, psycopg2
try:
    psycopg2.connect(sys.argv[1], options=sys.argv[2])
    print('connected')
except psycopg2.OperationalError as e:
    print(e.pgcode, str(e).splitlines()[0])`;
    const py = (await run('/usr/bin/python3', ['-c', program, sql.url('stale-py'), fenceOptions(6, fenceKey)])).stdout.trim();
    expect(py).toContain(`None connection to server at`);
    expect(py).toContain(`FATAL:  ${message}`);
    expect((await db.pool.query(`SELECT highest_token::text AS t FROM fencepost.fences WHERE fence_key = $1`, [fenceKey])).rows).toEqual([
      { t: '7' },
    ]);
    expect((await leader.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    await leader.end();
  });

  test('a client that names no application shows as fencepost-sql', async () => {
    expect(await nodePg({}, ownRow)).toBe('fencepost-sql');
  });

  // A timeout the client asks for at or below the proxy's own is the session's; it cannot lift the proxy's bound.
  test("statement_timeout from options (psql PGOPTIONS) or a startup parameter (node-postgres) at or below the proxy's own is the session's", async () => {
    expect(await psql('w', 'SHOW statement_timeout', { PGOPTIONS: '-c statement_timeout=200ms' })).toBe('200ms');
    expect(await nodePg({ statement_timeout: 200 }, 'SHOW statement_timeout')).toBe('200ms');
    expect(await psql('w', 'SHOW statement_timeout', { PGOPTIONS: '-c statement_timeout=4s' })).toBe('4s');
    const err = await run(PSQL, [sql.url('w'), '-X', '-v', 'VERBOSITY=verbose', '-c', 'SELECT pg_sleep(2)'], {
      env: libpqDefaults({ PGOPTIONS: '-c statement_timeout=200' }),
    }).catch((e: { stderr: string }) => e);
    expect((err as { stderr: string }).stderr).toContain('57014');
  });

  test('statement_timeout 0 ("none"), above the proxy\'s own, or not a time starts the session with the proxy\'s own', async () => {
    expect(await psql('w', 'SHOW statement_timeout', { PGOPTIONS: '-c statement_timeout=0' })).toBe('4s');
    expect(await nodePg({ statement_timeout: 3_600_000 }, 'SHOW statement_timeout')).toBe('4s');
    expect(await psql('w', 'SHOW statement_timeout', { PGOPTIONS: '-c statement_timeout=1h' })).toBe('4s');
    expect(await psql('w', 'SHOW statement_timeout', { PGOPTIONS: '-c statement_timeout=soon' })).toBe('4s');
    expect(await psql('w', 'SHOW statement_timeout')).toBe('4s');
  });

  test("lock_timeout is bounded by the proxy's own: a client may ask for less", async () => {
    expect(await psql('w', 'SHOW lock_timeout', { PGOPTIONS: '-c lock_timeout=300' })).toBe('300ms');
    expect(await psql('w', 'SHOW lock_timeout', { PGOPTIONS: '--lock-timeout=10s' })).toBe('1500ms');
    expect(await nodePg({ lock_timeout: 0 }, 'SHOW lock_timeout')).toBe('1500ms');
  });

  // FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS is 0 by default: the proxy bounds nothing, as Postgres.
  test("idle_in_transaction_session_timeout is the client's as it asked, else Postgres's (none)", async () => {
    expect(await nodePg({ idle_in_transaction_session_timeout: 2000 }, 'SHOW idle_in_transaction_session_timeout')).toBe('2s');
    expect(await psql('w', 'SHOW idle_in_transaction_session_timeout', { PGOPTIONS: '-c idle_in_transaction_session_timeout=1min' })).toBe(
      '1min',
    );
    expect(await nodePg({ idle_in_transaction_session_timeout: 0 }, 'SHOW idle_in_transaction_session_timeout')).toBe('0');
    expect(await psql('w', 'SHOW idle_in_transaction_session_timeout')).toBe('0');
  });
});
