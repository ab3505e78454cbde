// DATABASE_URL in every form libpq documents, read the same way by all three paths to Postgres
// (the write path's pool, /v1/transactions' client logins, the SQL endpoint's backends), and the
// settings the proxy forces on its sessions winning over the URL's own `options`.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { openBackend } from '../../src/proxy/sql/backend.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { clientConfig, databaseTarget, describeTarget, primaryFinder } from '../../src/fence/database-url.ts';
import { createPool } from '../../src/proxy/server.ts';
import { loadConfig } from '../../src/proxy/config.ts';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../support/sql.ts';

describe('reading DATABASE_URL', () => {
  test('a Unix socket folder, with or without credentials, as libpq writes it', () => {
    expect(databaseTarget('postgresql://fp:pw@/orders?host=/var/run/postgresql&port=5433')).toEqual({
      host: '/var/run/postgresql',
      port: 5433,
      database: 'orders',
      tls: null,
    });
    expect(databaseTarget('postgresql:///orders?host=/tmp')).toEqual({ host: '/tmp', port: 5432, database: 'orders', tls: null });
    expect(databaseTarget('postgres://fp@%2Fsockets:6000/orders')).toMatchObject({ host: '/sockets', port: 6000, database: 'orders' });
    expect(describeTarget(databaseTarget('postgresql://fp:pw@/orders?host=/tmp&port=5433'))).toBe('/tmp/.s.PGSQL.5433');
  });

  test('host names, IPv6 literals, escaped names, and the user name as the default database', () => {
    expect(databaseTarget('postgresql://fp:p%40ss@[::1]:5433/my%20db')).toEqual({ host: '::1', port: 5433, database: 'my db', tls: null });
    expect(describeTarget(databaseTarget('postgresql://fp@[::1]:5433/db'))).toBe('[::1]:5433');
    expect(databaseTarget('postgresql://owner@db.internal/')).toEqual({ host: 'db.internal', port: 5432, database: 'owner', tls: null });
    expect(databaseTarget('postgresql://fp@db.internal/x?sslmode=disable').tls).toBeNull();
    expect(databaseTarget('postgresql://fp@db.internal/x?sslmode=verify-full').tls).toEqual({});
    expect(databaseTarget('postgresql://fp@db.internal/x?sslmode=no-verify').tls).toEqual({ rejectUnauthorized: false });
  });

  test('what the URL leaves out comes from the PG* environment, as node-postgres reads it for the HTTP door', () => {
    const saved = { PGHOST: process.env.PGHOST, PGPORT: process.env.PGPORT, PGSSLMODE: process.env.PGSSLMODE };
    Object.assign(process.env, { PGHOST: '/run/pg', PGPORT: '6543', PGSSLMODE: 'verify-full' });
    try {
      expect(databaseTarget('postgresql://fp:pw@/orders')).toEqual({ host: '/run/pg', port: 6543, database: 'orders', tls: {} });
      // The URL's own settings win over the environment.
      expect(databaseTarget('postgresql://fp:pw@db:5/orders?sslmode=disable')).toEqual({
        host: 'db',
        port: 5,
        database: 'orders',
        tls: null,
      });
    } finally {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  test('a URL cannot set what the proxy owns: its timeouts, replication, or startup parameters smuggled in with a NUL', () => {
    const c = clientConfig(
      'postgresql://fp:pw@db/x?statement_timeout=0&lock_timeout=0&idle_in_transaction_session_timeout=0&replication=database',
      { options: '-c statement_timeout=7000' },
    );
    expect(c).toEqual({ host: 'db', database: 'x', user: 'fp', password: 'pw', options: '-c statement_timeout=7000' });
    const smuggled = `postgresql://fp:pw@db/x?options=${encodeURIComponent('-c a=b\u0000synchronous_commit\u0000off')}`;
    expect(() => loadConfig({ DATABASE_URL: smuggled })).toThrow(/DATABASE_URL: cannot be used: its options holds a NUL character/);
  });

  test("the proxy's options come after the URL's, and a login replaces the URL's credentials", () => {
    const c = clientConfig('postgresql://owner:secret@/db?host=/tmp&options=-c%20synchronous_commit%3Doff', {
      login: { user: 'fp_client', password: 'pw' },
      options: '-c synchronous_commit=on',
    });
    expect(c).toMatchObject({
      host: '/tmp',
      database: 'db',
      user: 'fp_client',
      password: 'pw',
      options: '-c synchronous_commit=off -c synchronous_commit=on',
    });
    expect(c.connectionString).toBeUndefined();
    // From a pool's settings: where to connect, not its size or timeouts.
    const fromPool = clientConfig({ connectionString: 'postgresql://owner:secret@db:6000/x', max: 7, query_timeout: 5 } as never);
    expect(fromPool).toEqual({ host: 'db', port: 6000, database: 'x', user: 'owner', password: 'secret' });
  });
});

// Several hosts, as libpq lists them: in the authority (each with its port) or in host= and port=.
// The finder tries them in the URL's order; one host keeps node-postgres's own resolution, no finder.
describe('a DATABASE_URL that lists several hosts', () => {
  const hostsOf = (url: string) => primaryFinder(url)?.opts.hosts;

  test('host:port pairs in the authority, IPv6 literals, and the default port for a host without one', () => {
    const url = 'postgresql://fp:p%40ss@db1:5432,[::1]:5433,db3/orders?target_session_attrs=read-write';
    expect(hostsOf(url)).toEqual([
      { host: 'db1', port: 5432 },
      { host: '::1', port: 5433 },
      { host: 'db3', port: 5432 },
    ]);
    expect(primaryFinder(url)?.opts.attrs).toBe('read-write');
    expect(describeTarget(databaseTarget(url))).toBe('db1:5432, [::1]:5433, db3:5432');
    const { Client, ...config } = clientConfig(url);
    expect(Client).toBe(primaryFinder(url)!.Client);
    // Credentials, database and TLS as for one host; host and port are the finder's, per connection.
    expect(config).toEqual({ host: 'db1', port: 5432, database: 'orders', user: 'fp', password: 'p@ss' });
    expect(databaseTarget(`${url}&sslmode=verify-full`)).toMatchObject({ database: 'orders', tls: {} });
  });

  test('Unix socket folders in host=, with one port for all or one per host', () => {
    expect(hostsOf('postgresql://fp:pw@/orders?host=/run/a,/run/b&port=5432,5433&target_session_attrs=primary')).toEqual([
      { host: '/run/a', port: 5432 },
      { host: '/run/b', port: 5433 },
    ]);
    expect(hostsOf('postgresql://fp:pw@/orders?host=/run/a,db2&port=6000')).toEqual([
      { host: '/run/a', port: 6000 },
      { host: 'db2', port: 6000 },
    ]);
    expect(describeTarget(databaseTarget('postgresql://fp:pw@/orders?host=/run/a,/run/b'))).toBe(
      '/run/a/.s.PGSQL.5432, /run/b/.s.PGSQL.5432',
    );
    expect(primaryFinder('postgresql://fp:pw@/orders?host=/run/a,/run/b')?.opts.attrs).toBe('any'); // libpq's default
  });

  test('one host is read as before: no finder, no Client of its own, whatever target_session_attrs says', () => {
    for (const url of [
      'postgresql://fp:pw@db/x',
      'postgresql://fp:pw@db:6000/x?target_session_attrs=read-write',
      'postgresql://fp:pw@/x?host=/tmp&port=5433',
    ]) {
      expect(primaryFinder(url)).toBeNull();
      expect(clientConfig(url).Client).toBeUndefined();
      expect(databaseTarget(url).follow).toBeUndefined();
    }
    expect(clientConfig('postgresql://fp:pw@db:6000/x?target_session_attrs=primary')).toEqual({
      host: 'db',
      port: 6000,
      database: 'x',
      user: 'fp',
      password: 'pw',
    });
  });

  test('each URL is one finder for the process: every door follows the same primary', () => {
    const url = 'postgresql://fp:pw@db1,db2/shared?target_session_attrs=read-write';
    expect(primaryFinder(url)).toBe(primaryFinder(url));
    expect(databaseTarget(url).follow).toBe(primaryFinder(url));
  });

  test.each([
    ['postgresql://fp@db1,/x', 'the host list\'s entry "" is not host[:port]'],
    ['postgresql://fp@db1:99999,db2/x', 'the host list\'s entry "db1:99999": port "99999" is not a number from 1 to 65535'],
    ['postgresql://fp@db1,db2:x/x', 'the host list\'s entry "db2:x": port "x" is not a number from 1 to 65535'],
    ['postgresql://fp@db1,db2/x?host=db3', 'give the hosts either in the URL (host1:port1,host2:port2) or in host=, not both'],
    [
      'postgresql://fp@db1,db2/x?port=5433',
      'with a host list in the URL, give each host its port there (host1:port1,host2:port2), not in port=',
    ],
    ['postgresql://fp@/x?host=/a,/b&port=1,2,3', 'host= lists 2 hosts but port= 3 ports: give one port, or one per host'],
    ['postgresql://fp@/x?host=/a,,/b', 'host= lists an empty host'],
    ['postgresql://fp@db/x?port=5432,5433', 'port= lists 2 ports for one host'],
    [
      'postgresql://fp@db1,db2/x?target_session_attrs=standby',
      'target_session_attrs=standby picks a server that takes no writes: use read-write or primary',
    ],
    [
      'postgresql://fp@db/x?target_session_attrs=read-only',
      'target_session_attrs=read-only picks a server that takes no writes: use read-write or primary',
    ],
    ['postgresql://fp@db1,db2/x?target_session_attrs=readwrite', 'target_session_attrs="readwrite" is not one of any, read-write, primary'],
    [
      'postgresql://fp@db1,db2/x?load_balance_hosts=random',
      'load_balance_hosts="random" is not supported: the hosts are tried in the URL\'s order (disable)',
    ],
    ['postgresql://fp@db1,db2/x?connect_timeout=soon', 'connect_timeout="soon" is not a whole number of seconds'],
  ])('%s is refused in one line naming DATABASE_URL', (url, why) => {
    expect(() => loadConfig({ DATABASE_URL: url })).toThrow(`DATABASE_URL: cannot be used: ${why}`);
  });

  test("connect_timeout bounds each host's probe, as libpq bounds each host's connect (at least 2 s)", () => {
    expect(primaryFinder('postgresql://fp@db1,db2/t1?connect_timeout=5')?.opts.probeTimeoutMs).toBe(5000);
    expect(primaryFinder('postgresql://fp@db1,db2/t2?connect_timeout=1')?.opts.probeTimeoutMs).toBe(2000);
    expect(primaryFinder('postgresql://fp@db1,db2/t3')?.opts.probeTimeoutMs).toBe(2000);
  });
});

// Postgres on this host, reached over its Unix socket in the form WHATWG URL refuses
// (credentials and no host), with `options` in the URL that would switch off durability.
describe('a proxy whose DATABASE_URL names the Unix socket', () => {
  let db: TestDatabase;
  let sql: SqlProxy | null = null;
  let socketUrl: string | null = null;
  /** The socket folder and port of socketUrl. */
  let socket = { dir: '', port: '' };
  beforeAll(async () => {
    db = await createTestDatabase();
    const dirs = (await db.pool.query<{ unix_socket_directories: string }>('SHOW unix_socket_directories')).rows[0]!
      .unix_socket_directories;
    const port = (await db.pool.query<{ port: string }>('SHOW port')).rows[0]!.port;
    const dir = dirs
      .split(',')
      .map((d) => d.trim())
      .find((d) => d.startsWith('/') && existsSync(join(d, `.s.PGSQL.${port}`)));
    if (dir === undefined) return; // a server elsewhere (DATABASE_URL): no socket on this host
    const u = new URL(db.url);
    // Every way a URL could set what the proxy forces: options, and the timeouts as parameters.
    const options = encodeURIComponent('-c synchronous_commit=off -c statement_timeout=0');
    socket = { dir, port };
    socketUrl = `postgresql://${u.username}:${u.password}@/${u.pathname.slice(1)}?host=${encodeURIComponent(dir)}&port=${port}&options=${options}&statement_timeout=0&lock_timeout=0`;
    sql = await startSqlProxy(db, {
      DATABASE_URL: socketUrl,
      FENCEPOST_STATEMENT_TIMEOUT_MS: '7000',
      FENCEPOST_TX_STATEMENT_TIMEOUT_MS: '6000',
    });
    await db.pool.query('CREATE TABLE public.counters (id int PRIMARY KEY, n int NOT NULL)');
    await db.pool.query('INSERT INTO public.counters VALUES (1, 0), (2, 0)');
    await db.pool.query(`GRANT SELECT, UPDATE ON public.counters TO ${clientRoleFor(db.url)}`);
  });
  afterAll(async () => {
    await sql?.close();
    await db?.drop();
  });

  test('the write path commits durably over the socket', async (ctx) => {
    if (socketUrl === null) ctx.skip();
    const pool = createPool(socketUrl!, 1, { statementTimeoutMs: 7000, lockTimeoutMs: 3000 });
    try {
      const { rows } = await pool.query<{ sc: string; st: string; lt: string; path: string | null }>(
        "SELECT current_setting('synchronous_commit') AS sc, current_setting('statement_timeout') AS st, current_setting('lock_timeout') AS lt, (SELECT client_addr::text FROM pg_stat_activity WHERE pid = pg_backend_pid()) AS path",
      );
      expect(rows[0]).toEqual({ sc: 'on', st: '7s', lt: '3s', path: null }); // client_addr is null on a Unix socket
    } finally {
      await pool.end();
    }
    // The durability check opens a connection of its own, like the pool's: it reads the settings.
    const ready = (await (await fetch(`${sql!.proxy.url}/readyz`)).json()) as { durability: { synchronousCommit: string } };
    expect(ready.durability.synchronousCommit).toBe('on');
    const r = await fetch(`${sql!.proxy.url}/v1/objects/socket-1`, {
      method: 'PUT',
      headers: { 'fencing-token': '1', 'content-type': 'application/json' },
      body: '{"over":"socket"}',
    });
    expect(r.status).toBe(200);
    const stored = await db.pool.query<{ body: Buffer }>("SELECT body FROM fencepost.objects WHERE key = 'socket-1'");
    expect(stored.rows[0]!.body.toString()).toBe('{"over":"socket"}');
  });

  test('a host= list of socket folders: the pool and the SQL endpoint dial the first that takes writes', async (ctx) => {
    if (socketUrl === null) ctx.skip();
    const u = new URL(db.url);
    const { dir, port } = socket;
    const gone = join(tmpdir(), `fencepost-no-socket-${process.pid}`);
    const listUrl = `postgresql://${u.username}:${u.password}@/${u.pathname.slice(1)}?host=${encodeURIComponent(`${gone},${dir}`)}&port=${port}&target_session_attrs=read-write`;
    expect(describeTarget(databaseTarget(listUrl))).toBe(`${gone}/.s.PGSQL.${port}, ${dir}/.s.PGSQL.${port}`);
    const pool = createPool(listUrl, 1);
    try {
      expect(
        (await pool.query<{ path: string | null }>('SELECT client_addr::text AS path FROM pg_stat_activity WHERE pid = pg_backend_pid()'))
          .rows,
      ).toEqual([{ path: null }]);
    } finally {
      await pool.end();
    }
    const login = {
      user: decodeURIComponent(u.username),
      password: decodeURIComponent(u.password),
      parameters: new Map<string, string>(),
      settings: new Map<string, string>(),
    };
    const backend = await openBackend(databaseTarget(listUrl), login, 5000);
    backend.socket.destroy();
    expect(backend.target).toMatchObject({ host: dir, port: Number(port) });
  });

  test('/v1/transactions logs its client login in over the socket, with durable commits', async (ctx) => {
    if (socketUrl === null) ctx.skip();
    const r = await fetch(`${sql!.proxy.url}/v1/transactions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        fences: [{ key: 'socket-tx', token: '3' }],
        statements: [
          { sql: "SELECT current_setting('synchronous_commit') AS sc, current_user AS who" },
          { sql: 'UPDATE public.counters SET n = n + 1 WHERE id = 1' },
        ],
      }),
    });
    const body = (await r.json()) as { results: { rows: unknown[] }[] };
    expect(r.status).toBe(200);
    expect(body.results[0]!.rows).toEqual([{ sc: 'on', who: clientRoleFor(db.url) }]);
    expect((await db.pool.query('SELECT n FROM public.counters WHERE id = 1')).rows[0]).toEqual({ n: 1 });
    expect(await fenceRow(db.pool, 'socket-tx')).toEqual({ highest_token: '3' });
  });

  test('the SQL endpoint dials its backends over the socket and fences their transactions', async (ctx) => {
    if (socketUrl === null) ctx.skip();
    const c = await sql!.connect('socket-writer', { options: fenceOptions(4, 'socket-sql') });
    try {
      await c.query('UPDATE public.counters SET n = n + 1 WHERE id = 2');
      expect(
        (await c.query<{ path: string | null }>('SELECT client_addr::text AS path FROM pg_stat_activity WHERE pid = pg_backend_pid()'))
          .rows[0],
      ).toEqual({ path: null });
    } finally {
      await c.end();
    }
    expect((await db.pool.query('SELECT n FROM public.counters WHERE id = 2')).rows[0]).toEqual({ n: 1 });
    expect(await fenceRow(db.pool, 'socket-sql')).toEqual({ highest_token: '4' });
  });
});
