// A DATABASE_URL that lists several hosts with target_session_attrs=read-write: every door (HTTP
// objects, /v1/transactions, the SQL endpoint) writes to the host that takes writes, whatever its
// place in the list, and follows it when the roles switch, without a restart: the writes in the
// gap answer 503 (nothing committed), never 500. Real streaming replication, a real promotion.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import pino from 'pino';
import { connect, createServer, type Server } from 'node:net';
import { Writable } from 'node:stream';
import { startFailoverPair, type FailoverPair } from '../support/replication.ts';
import { fenceOptions } from '../support/sql.ts';
import { loadConfig } from '../../src/proxy/config.ts';
import { startProxy, type RunningProxy } from '../../src/proxy/server.ts';
import { closedPort, listenFree, portRangeEnv } from '../../tools/ports.ts';
import { clientConfig, databaseTarget, primaryFinder } from '../../src/fence/database-url.ts';
import { leaveOldHosts, newClient } from '../../src/fence/primary-finder.ts';
import { BackendStartupError, openBackend } from '../../src/proxy/sql/backend.ts';

const CLIENT_ROLE = 'fpc_multi_host';

let pair: FailoverPair;
/** Credentials and database of the pair's admin URL, for URLs of our own. */
let auth: { user: string; password: string; database: string };

function multiHostUrl(ports: number[], query = 'target_session_attrs=read-write'): string {
  return `postgresql://${auth.user}:${auth.password}@${ports.map((p) => `127.0.0.1:${p}`).join(',')}/${auth.database}?${query}`;
}

/** `log`: the proxy's log lines at info and above, parsed. */
async function start(databaseUrl: string, log?: Record<string, unknown>[]): Promise<RunningProxy> {
  const config = loadConfig({
    DATABASE_URL: databaseUrl,
    PORT: '0',
    FENCEPOST_PGWIRE_PORT: '0',
    FENCEPOST_CLIENT_ROLE: CLIENT_ROLE,
    FENCEPOST_LOG_LEVEL: 'silent',
    ...portRangeEnv(),
  });
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split('\n').filter(Boolean)) log!.push(JSON.parse(line) as Record<string, unknown>);
      done();
    },
  });
  return await startProxy(config, log ? pino({ level: 'info' }, sink) : pino({ level: process.env.FENCEPOST_TEST_LOG ?? 'silent' }));
}

async function on<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: url });
  c.on('error', () => {});
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end().catch(() => {});
  }
}

async function put(
  proxy: RunningProxy,
  key: string,
  token: number,
  body: string,
): Promise<{ status: number; json: { error?: string; message?: string } }> {
  const r = await fetch(`${proxy.url}/v1/objects/${encodeURIComponent(key)}`, {
    method: 'PUT',
    headers: { 'fencing-token': String(token), 'fence-key': 'mh' },
    body,
  });
  return { status: r.status, json: (await r.json()) as { error?: string; message?: string } };
}

async function transaction(proxy: RunningProxy, token: number): Promise<{ status: number; json: { error?: string; message?: string } }> {
  const r = await fetch(`${proxy.url}/v1/transactions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      fences: [{ key: 'mh-tx', token: String(token) }],
      statements: [{ sql: 'UPDATE public.counters SET n = n + 1 WHERE id = 1' }],
    }),
  });
  return { status: r.status, json: (await r.json()) as { error?: string; message?: string } };
}

/** A fenced UPDATE through the SQL endpoint, on a session of its own. */
async function sqlWrite(proxy: RunningProxy, token: number): Promise<void> {
  const c = new pg.Client({
    host: '127.0.0.1',
    port: proxy.pgwirePort!,
    user: 'mh-writer',
    database: auth.database,
    options: fenceOptions(token, 'mh-sql'),
  });
  c.on('error', () => {});
  await c.connect();
  try {
    await c.query('UPDATE public.counters SET n = n + 1 WHERE id = 2');
  } finally {
    await c.end().catch(() => {});
  }
}

async function counters(url: string): Promise<number[]> {
  return await on(url, async (c) => (await c.query<{ n: number }>('SELECT n FROM public.counters ORDER BY id')).rows.map((r) => r.n));
}

beforeAll(async () => {
  pair = await startFailoverPair('fp_multi_host');
  const u = new URL(pair.primaryUrl);
  auth = { user: decodeURIComponent(u.username), password: decodeURIComponent(u.password), database: u.pathname.slice(1) };
  await on(pair.primaryUrl, async (c) => {
    await c.query('CREATE TABLE public.counters (id int PRIMARY KEY, n int NOT NULL)');
    await c.query('INSERT INTO public.counters VALUES (1, 0), (2, 0)');
  });
}, 120_000);

afterAll(async () => {
  await pair?.stop();
});

describe('starting against the list', () => {
  test('the first host down: the proxy writes to the next that takes writes', async () => {
    const proxy = await start(multiHostUrl([await closedPort(), pair.standbyPort, pair.primaryPort]));
    try {
      expect((await put(proxy, 'mh/0', 1, 'zero')).status).toBe(200);
      expect(await on(pair.primaryUrl, async (c) => (await c.query("SELECT 1 FROM fencepost.objects WHERE key = 'mh/0'")).rowCount)).toBe(
        1,
      );
    } finally {
      await proxy.close();
    }
  });

  test("without target_session_attrs, libpq's `any`: the first host that answers, a standby too, and a warning at start", async () => {
    const log: Record<string, unknown>[] = [];
    const proxy = await start(multiHostUrl([pair.standbyPort, pair.primaryPort], 'application_name=mh'), log).catch((e: Error) => e);
    // The standby answers first, and the migrations need the primary: the start fails, as it would on the standby alone.
    expect((proxy as Error).message).toMatch(
      new RegExp(
        `^DATABASE_URL: 127\\.0\\.0\\.1:${pair.standbyPort}, 127\\.0\\.0\\.1:${pair.primaryPort} \\(database ${auth.database}\\): cannot execute .* in a read-only transaction \\(SQLSTATE 25006\\)$`,
      ),
    );
    expect(log.filter((l) => l.level === 40).map((l) => l.msg)).toContain(
      'DATABASE_URL lists several hosts without target_session_attrs=read-write (or primary): connections go to the first that answers, even a standby, as libpq does',
    );
  });

  test('no host takes writes: the proxy does not start, and says why in one line naming DATABASE_URL', async () => {
    const down = await closedPort();
    const err = await start(multiHostUrl([pair.standbyPort, down])).then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).toBe(
      `DATABASE_URL: no host takes writes (target_session_attrs=read-write): 127.0.0.1:${pair.standbyPort} is in recovery (a standby); 127.0.0.1:${down} refused the connection`,
    );
  });
});

/** A TCP port that forwards each new connection to `to` (a name or address that moves, as a VIP does). */
async function forwarder(to: number): Promise<{ port: number; to: number; close(): Promise<void> }> {
  const f = { port: 0, to, close: async () => {} };
  const server: Server = createServer((socket) => {
    const up = connect(f.to, '127.0.0.1');
    socket.pipe(up).pipe(socket);
    socket.on('error', () => up.destroy());
    up.on('error', () => socket.destroy());
  });
  f.port = await listenFree(server);
  f.close = () => new Promise<void>((r) => server.close(() => r()));
  return f;
}

describe('a host that is now a standby, under a name the proxy found writable', () => {
  test('a new connection that logs in to a hot standby is left, at both kinds of dial, and the search says why', async () => {
    const moving = await forwarder(pair.primaryPort);
    const down = await closedPort();
    try {
      const url = multiHostUrl([moving.port, down]);
      const finder = primaryFinder(url)!;
      const foundAgain = async () => {
        for (let i = 0; ; i++) {
          const h = await finder.target().catch(() => null); // a search that found nothing is reused 250 ms
          if (h !== null || i > 50) return h;
          await new Promise((r) => setTimeout(r, 100));
        }
      };
      expect(await foundAgain()).toEqual({ host: '127.0.0.1', port: moving.port });
      const hot = `127.0.0.1:${moving.port} is in hot standby (target_session_attrs=read-write); looking for the primary again`;
      // The SQL endpoint's dial.
      moving.to = pair.standbyPort; // the name now reaches the standby; no connection of the proxy failed
      const login = {
        user: auth.user,
        password: auth.password,
        parameters: new Map<string, string>(),
        settings: new Map<string, string>(),
      };
      const backend = await openBackend(databaseTarget(url), login, 5000).then(
        () => null,
        (e: Error) => e,
      );
      expect(backend).toBeInstanceOf(BackendStartupError);
      expect([(backend as BackendStartupError).code, backend?.message]).toEqual(['08001', hot]);
      // node-postgres's, for the pools and the checks.
      moving.to = pair.primaryPort;
      expect(await foundAgain()).toEqual({ host: '127.0.0.1', port: moving.port });
      moving.to = pair.standbyPort;
      const pooled = await newClient(clientConfig(url))
        .connect()
        .then(
          () => null,
          (e: Error & { code?: string }) => e,
        );
      expect([pooled?.code, pooled?.message]).toEqual(['08001', hot]);
      // Both told the finder, whose search now says why no host fits.
      const why = await finder.target().then(
        () => null,
        (e: Error) => e.message,
      );
      expect(why).toBe(
        `no host takes writes (target_session_attrs=read-write): 127.0.0.1:${moving.port} is in recovery (a standby); 127.0.0.1:${down} refused the connection`,
      );
    } finally {
      await moving.close();
    }
  });
});

describe("a pool of the finder's clients", () => {
  test('a connection that saw 25006 is closed when released, not reused; one that did not is kept', async () => {
    const pool = leaveOldHosts(new pg.Pool({ ...clientConfig(multiHostUrl([pair.standbyPort, pair.primaryPort])), max: 1 }));
    pool.on('error', () => {});
    const pidOf = async (c: pg.PoolClient) => (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    try {
      const kept = await pool.connect();
      const first = await pidOf(kept);
      kept.release();
      const refused = await pool.connect();
      expect(await pidOf(refused)).toBe(first);
      await refused.query('BEGIN READ ONLY');
      expect(
        await refused.query('CREATE TABLE public.never_made (id int)').then(
          () => null,
          (e: pg.DatabaseError) => e.code,
        ),
      ).toBe('25006');
      await refused.query('ROLLBACK');
      refused.release(); // without an error, as a caller that handled it would
      const next = await pool.connect();
      try {
        expect(await pidOf(next)).not.toBe(first);
      } finally {
        next.release();
      }
    } finally {
      await pool.end();
    }
  });
});

describe('the standby listed first, the primary second', () => {
  let proxy: RunningProxy;
  const log: Record<string, unknown>[] = [];
  beforeAll(async () => {
    proxy = await start(multiHostUrl([pair.standbyPort, pair.primaryPort]), log);
    await on(pair.primaryUrl, (c) => c.query(`GRANT SELECT, UPDATE ON public.counters TO ${CLIENT_ROLE}`));
  }, 60_000);
  afterAll(async () => {
    await proxy?.close();
  });

  test('writes at every door land on the primary, and /readyz is ready', async () => {
    expect((await put(proxy, 'mh/1', 1, 'one')).status).toBe(200);
    expect((await transaction(proxy, 1)).status).toBe(200);
    await sqlWrite(proxy, 1);
    const stored = await on(
      pair.primaryUrl,
      async (c) => (await c.query<{ body: Buffer }>("SELECT body FROM fencepost.objects WHERE key = 'mh/1'")).rows,
    );
    expect(stored.map((r) => r.body.toString())).toEqual(['one']);
    expect(await counters(pair.primaryUrl)).toEqual([1, 1]);
    expect((await fetch(`${proxy.url}/readyz`)).status).toBe(200);
  });

  test('errors a client statement raises in /v1/transactions (57P01, 08006, 25006 of its own read-only transaction) never send the proxy searching', async () => {
    // Invariant: only the proxy's own observations move the primary finder; a tenant cannot make
    // every other tenant's new connections wait on a search.
    const finder = primaryFinder(multiHostUrl([pair.standbyPort, pair.primaryPort]))!;
    const post = (...sqls: string[]) =>
      fetch(`${proxy.url}/v1/transactions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ fences: [{ key: 'mh-tx', token: '1' }], statements: sqls.map((sql) => ({ sql })) }),
      });
    const harmless = 'UPDATE public.counters SET n = n WHERE id = 1';
    expect((await post(harmless)).status).toBe(200); // found, and pooled
    const searches = finder.searches;
    const hostile = [
      // A leading `;` passes the door's friendly check; Postgres runs what follows.
      [";DO $$BEGIN RAISE EXCEPTION 'not really' USING ERRCODE = '57P01'; END$$"],
      [";DO $$BEGIN RAISE EXCEPTION 'not really' USING ERRCODE = '08006'; END$$"],
      ["UPDATE pg_settings SET setting = 'on' WHERE name = 'transaction_read_only'", harmless], // a real 25006
    ];
    for (let i = 0; i < 4; i++) {
      for (const sqls of hostile) {
        const r = await post(...sqls);
        expect(r.status, sqls[0]).toBe(400);
        expect(((await r.json()) as { sqlState?: string }).sqlState, sqls[0]).toMatch(/^(57P01|08006|25006)$/);
      }
    }
    expect(finder.searches).toBe(searches);
    expect(finder.current()).toMatchObject({ port: pair.primaryPort });
    expect((await post(harmless)).status).toBe(200);
  });

  test('the primary turns read-only under open connections: 503, never 500, and the proxy looks again; writable again, writes commit', async () => {
    expect((await put(proxy, 'mh/ro-before', 1, 'x')).status).toBe(200); // a pooled connection to the primary exists
    await on(pair.primaryUrl, async (c) => {
      await c.query('ALTER SYSTEM SET default_transaction_read_only = on');
      await c.query('SELECT pg_reload_conf()');
    });
    try {
      // Open sessions see the reload at their next statement: 25006 (read-only), then the search says why.
      const answers: { status: number; json: { error?: string; message?: string } }[] = [];
      for (let i = 0; i < 50 && !answers.some((a) => /no host takes writes/.test(a.json.message ?? '')); i++) {
        answers.push(await put(proxy, `mh/ro-${i}`, 1, 'x'));
        if (answers.at(-1)!.status === 200) await new Promise((r) => setTimeout(r, 100)); // the reload not seen yet
      }
      const refused = answers.filter((a) => a.status !== 200);
      expect(refused.length).toBeGreaterThan(0);
      expect(refused.map((a) => [a.status, a.json.error])).toEqual(refused.map(() => [503, 'unavailable']));
      expect(refused.at(-1)!.json.message).toMatch(
        new RegExp(
          `127\\.0\\.0\\.1:${pair.standbyPort} is in recovery \\(a standby\\); 127\\.0\\.0\\.1:${pair.primaryPort} is read-only \\(default_transaction_read_only\\)`,
        ),
      );
    } finally {
      await on(pair.primaryUrl, async (c) => {
        await c.query('ALTER SYSTEM RESET default_transaction_read_only');
        await c.query('SELECT pg_reload_conf()');
      });
    }
    let status = 0;
    for (let i = 0; i < 50 && status !== 200; i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 100));
      status = (await put(proxy, 'mh/ro-after', 1, 'x')).status;
    }
    expect(status).toBe(200);
  });

  /** Writers that keep writing through the switch: each key once, with the answer it got. */
  const load = { stop: false, answers: [] as { key: string; status: number; error: string | undefined }[], running: [] as Promise<void>[] };

  test('the primary stops: writes answer 503 naming each host, /readyz 503, the SQL endpoint 08001; none 500', async () => {
    load.running = [0, 1, 2].map(async (w) => {
      for (let i = 0; !load.stop; i++) {
        const key = `mh/load-${w}-${i}`;
        const a = await put(proxy, key, 2, key).catch(() => ({ status: 0, json: { error: 'no answer' } }));
        load.answers.push({ key, status: a.status, error: a.json.error });
        await new Promise((r) => setTimeout(r, 20));
      }
    });
    await new Promise((r) => setTimeout(r, 200)); // writes under way when the primary stops
    await pair.stopPrimary();
    // A search during the shutdown may see the old primary still stopping (57P03, a cut connection);
    // once it has stopped, the answer says it refused the connection. Every answer is a 503.
    const answers: { status: number; json: { error?: string; message?: string } }[] = [];
    const steady = new RegExp(
      `no host takes writes \\(target_session_attrs=read-write\\): 127\\.0\\.0\\.1:${pair.standbyPort} is in recovery \\(a standby\\); 127\\.0\\.0\\.1:${pair.primaryPort} refused the connection; nothing committed, safe to retry`,
    );
    for (let i = 0; i < 50 && !steady.test(answers.at(-1)?.json.message ?? ''); i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 100));
      answers.push(await put(proxy, 'mh/gap', 2, 'gap'));
    }
    expect(answers.map((a) => [a.status, a.json.error])).toEqual(answers.map(() => [503, 'unavailable']));
    expect(answers.at(-1)!.json.message).toMatch(steady);
    expect((await transaction(proxy, 2)).status).toBe(503);
    const ready = await fetch(`${proxy.url}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { message: string }).message).toMatch(/no host takes writes/);
    const refused = await sqlWrite(proxy, 2).then(
      () => null,
      (e: pg.DatabaseError) => e,
    );
    expect(refused?.code).toBe('08001');
    expect(refused?.message).toMatch(/no host takes writes/);
  });

  test('the standby is promoted: writes commit on it at every door, with no restart of the proxy', async () => {
    await pair.promoteStandby();
    // The first write after the promotion may meet the search that found nothing (reused 250 ms).
    const statuses: number[] = [];
    for (let i = 0; i < 100; i++) {
      const w = await put(proxy, 'mh/2', 2, 'two');
      statuses.push(w.status);
      if (w.status === 200) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(statuses.at(-1)).toBe(200);
    expect(statuses.filter((s) => s !== 200 && s !== 503)).toEqual([]);
    expect((await transaction(proxy, 2)).status).toBe(200);
    await sqlWrite(proxy, 2);
    const stored = await on(pair.standbyUrl, async (c) =>
      (await c.query<{ key: string }>("SELECT key FROM fencepost.objects WHERE key LIKE 'mh/%' ORDER BY key")).rows.map((r) => r.key),
    );
    expect(stored.filter((k) => !k.startsWith('mh/ro-') && !k.startsWith('mh/load-'))).toEqual(['mh/0', 'mh/1', 'mh/2']); // the gap's write committed nowhere
    expect(await counters(pair.standbyUrl)).toEqual([2, 2]);
    expect((await fetch(`${proxy.url}/readyz`)).status).toBe(200);
  });

  test('writers that kept writing through the switch got 200 or 503, never 500, and every 200 is on the new primary', async () => {
    // Invariant: a 200 is committed on the primary that serves now; an `unavailable` 503 committed nowhere.
    await new Promise((r) => setTimeout(r, 300)); // writes after the promotion too
    load.stop = true;
    await Promise.all(load.running);
    const stored = new Set(
      await on(pair.standbyUrl, async (c) =>
        (await c.query<{ key: string }>("SELECT key FROM fencepost.objects WHERE key LIKE 'mh/load-%'")).rows.map((r) => r.key),
      ),
    );
    expect(load.answers.filter((a) => a.status !== 200 && a.status !== 503)).toEqual([]);
    const ok = load.answers.filter((a) => a.status === 200);
    expect(ok.length).toBeGreaterThan(0);
    expect(ok.filter((a) => !stored.has(a.key))).toEqual([]);
    expect(load.answers.filter((a) => a.error === 'unavailable' && stored.has(a.key))).toEqual([]);
    expect(load.answers.some((a) => a.status === 503)).toBe(true); // the gap was seen
  });

  test('the log says where new connections go, and when no host fits, once per change', () => {
    const said = log
      .filter((l) => typeof l.msg === 'string' && l.msg.startsWith('DATABASE_URL'))
      .map((l) => [l.msg, l.host ?? String(l.reason).split(':')[0]]);
    const found = 'DATABASE_URL: new connections go to this host';
    const lost = 'DATABASE_URL: no host fits target_session_attrs; writes answer 503 until one does';
    const none = 'no host takes writes (target_session_attrs=read-write)';
    // This proxy started after the URL's finder (the process's) had found the primary: it logs the changes since.
    expect(said).toEqual([
      [lost, none], // the primary read-only
      [found, `127.0.0.1:${pair.primaryPort}`],
      [lost, none], // the primary stopped
      [found, `127.0.0.1:${pair.standbyPort}`], // the standby promoted
    ]);
  });
});
