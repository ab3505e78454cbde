// Ports for the servers tests start (src/ports.ts, tools/ports.ts): a server we do not write starts on a picked
// port, and when another process holds that port, on another one; what then answers is that server.
// Each test hands in the held port as the first pick.
import { afterAll, describe, expect, inject, test, vi } from 'vitest';
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, connect, type AddressInfo, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { ephemeralRange, freePort, isPortTaken, listenInRange, portRange, startOnFreePort, type PortPicking } from '../src/ports.ts';
import { closedPort, listenFree, portTakenLine } from '../tools/ports.ts';
import { startPostgres } from '../tools/postgres.ts';
import { startPgbouncer } from '../tools/pgbouncer.ts';
import { LocalZooKeeper, fourLetterWord } from '../src/demo/local-zookeeper.ts';
import { createTestDatabase } from './support/db.ts';
import { oneLineFailure, run } from './support/cli.ts';
import { BIN, listen, spawnProxy, testApp } from './support/proxy.ts';
import { startSqlProxy } from './support/sql.ts';
import { uniquePath } from './support/election.ts';

const dir = mkdtempSync(join(tmpdir(), 'fencepost-ports-'));
chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
const held: Server[] = [];

afterAll(async () => {
  await Promise.all(held.map((s) => new Promise((r) => s.close(r))));
  rmSync(dir, { recursive: true, force: true });
});

/** A port outside the ephemeral range that this process listens on until the file ends. */
async function holdPort(): Promise<number> {
  for (;;) {
    const port = await freePort();
    const server = createServer((socket) => socket.destroy());
    const bound = await new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false));
      server.listen({ host: '127.0.0.1', port }, () => resolve(true));
    });
    if (!bound) continue; // taken since the pick: another one
    held.push(server);
    return port;
  }
}

/** Picks `first`, then free ports; records every pick. */
function heldFirst(first: number): PortPicking & { picked: number[] } {
  const picked: number[] = [];
  return {
    picked,
    pick: async () => {
      const port = picked.length === 0 ? first : await freePort();
      picked.push(port);
      return port;
    },
  };
}

function listenOn(port: number): Promise<Server> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen({ host: '127.0.0.1', port }, () => resolve(server));
  });
}

test('freePort hands out free ports outside the ephemeral range, so no listen(0) elsewhere takes one while its server restarts', async () => {
  // listen(0) and outgoing connections are handed ports from the ephemeral range only.
  const [low, high] = ephemeralRange();
  for (let i = 0; i < 20; i++) {
    const port = await freePort();
    expect(port < low || port > high, `${port} in ${low}-${high}`).toBe(true);
    const server = await listenOn(port).catch(() => null); // another file's server may have it by now
    await new Promise((r) => (server ? server.close(r) : r(null)));
  }
});

test('closedPort is a port that refuses connections, fetch() included (not one of its bad ports)', async () => {
  const port = await closedPort();
  const refused = await new Promise<string | undefined>((resolve) => {
    const s = connect({ host: '127.0.0.1', port }, () => {
      s.destroy();
      resolve('connected');
    });
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code));
  });
  expect(refused).toBe('ECONNREFUSED');
  const viaFetch = await fetch(`http://127.0.0.1:${port}/`).then(
    () => null,
    (e: Error) => (e.cause as NodeJS.ErrnoException | undefined)?.code,
  );
  expect(viaFetch).toBe('ECONNREFUSED');
});

test('startOnFreePorts starts again on another port when the picked one is held, and only then', async () => {
  const taken = await holdPort();
  const picking = heldFirst(taken);
  const server = await startOnFreePort((port) => listenOn(port), picking);
  try {
    const port = (server.address() as AddressInfo).port;
    expect(picking.picked).toEqual([taken, port]); // the held port first, then one that bound
  } finally {
    await new Promise((r) => server.close(r));
  }
  // Any other failure ends it at the first attempt.
  let starts = 0;
  const other = await startOnFreePort(async () => {
    starts++;
    throw new Error('not a port problem');
  }).catch((e: Error) => e);
  expect([starts, other.message]).toEqual([1, 'not a port problem']);
  // Bounded: a port held at every attempt ends it after `attempts`, with each failure.
  const always = await startOnFreePort((port) => listenOn(port), { attempts: 3, pick: async () => taken }).catch((e: unknown) => e);
  expect(always).toBeInstanceOf(AggregateError);
  expect((always as AggregateError).errors).toHaveLength(3);
  expect(isPortTaken(always)).toBe(true);
});

test("the words of a port taken are recognised: the OS's, Postgres's lock file, fencepost serve's one line; not another failure", () => {
  expect(
    portTakenLine(
      '2026-12-03 LOG:  could not bind IPv4 address "127.0.0.1": Address already in use\nFATAL: could not create any TCP/IP sockets',
    ),
  ).toBe('2026-12-03 LOG:  could not bind IPv4 address "127.0.0.1": Address already in use');
  expect(portTakenLine('FATAL:  lock file "/tmp/.s.PGSQL.41234.lock" already exists')).not.toBeNull();
  expect(
    portTakenLine('fencepost: cannot start: PORT: 127.0.0.1:41234 is already in use (another fencepost serve? set PORT or --port)'),
  ).not.toBeNull();
  expect(
    portTakenLine(
      'fencepost: cannot start: FENCEPOST_PGWIRE_PORT: 127.0.0.1:41235 is already in use (another fencepost serve? set FENCEPOST_PGWIRE_PORT)',
    ),
  ).not.toBeNull();
  expect(portTakenLine('fencepost: cannot start: FENCEPOST_DATA_DIR: /x is in use by a running Postgres (pid 12)')).toBeNull();
  expect(portTakenLine('FATAL:  data directory "/x" has invalid permissions')).toBeNull();
});

test(
  'Postgres whose picked port is held starts on another, and the server answering there runs on its data directory',
  { timeout: 120_000 },
  async () => {
    const taken = await holdPort();
    const picking = heldFirst(taken);
    const dataDir = join(dir, 'pg');
    const server = await startPostgres({ dataDir, ports: picking });
    try {
      expect(picking.picked[0]).toBe(taken);
      expect(server.port).not.toBe(taken);
      expect(picking.picked.at(-1)).toBe(server.port);
      const client = new pg.Client({ connectionString: server.url });
      await client.connect();
      const { rows } = await client.query<{ data_directory: string }>('SHOW data_directory');
      await client.end();
      expect(rows[0]?.data_directory).toBe(dataDir);
    } finally {
      await server.stop();
    }
  },
);

test(
  'ZooKeeper whose picked client port is held starts on others, and the server answering there is this one',
  { timeout: 120_000 },
  async () => {
    const taken = await holdPort();
    const picking = heldFirst(taken);
    const baseDir = join(dir, 'zk');
    const zk = await LocalZooKeeper.start({ servers: 1, baseDir, ports: picking });
    try {
      const port = zk.node(1).clientPort;
      expect(picking.picked[0]).toBe(taken);
      expect(port).not.toBe(taken);
      expect(await fourLetterWord(port, 'conf')).toContain(`dataDir=${join(baseDir, 'zk1')}/`);
    } finally {
      await zk.stop();
    }
  },
);

test('PgBouncer whose picked port is held starts on another, and logs in to its database there', { timeout: 60_000 }, async () => {
  const taken = await holdPort();
  const picking = heldFirst(taken);
  const db = await createTestDatabase({ migrate: false });
  const bouncer = await startPgbouncer(db.url, 2, picking);
  try {
    expect(picking.picked[0]).toBe(taken);
    expect(Number(new URL(bouncer.url).port)).not.toBe(taken);
    const client = new pg.Client({ connectionString: bouncer.url });
    await client.connect();
    const { rows } = await client.query<{ db: string }>('SELECT current_database() AS db');
    await client.end();
    expect(rows[0]?.db).toBe(decodeURIComponent(new URL(db.url).pathname.slice(1)));
  } finally {
    await bouncer.stop();
    await db.drop();
  }
});

describe('FENCEPOST_PORT_RANGE', () => {
  /** A range of `size` ports around a free port, inside 1024-65535. */
  async function someRange(size: number): Promise<[number, number]> {
    const port = await freePort();
    const lo = Math.min(port, 65_535 - size + 1);
    return [lo, lo + size - 1];
  }

  test('freePort picks only ports inside the range; a range with every port held says so, naming the variable', async () => {
    const [lo, hi] = await someRange(40);
    const env = { FENCEPOST_PORT_RANGE: `${lo}-${hi}` };
    for (let i = 0; i < 20; i++) {
      const port = await freePort(env);
      expect(port >= lo && port <= hi, `${port} in ${lo}-${hi}`).toBe(true);
    }
    const held = await holdPort();
    await expect(freePort({ FENCEPOST_PORT_RANGE: `${held}-${held}` })).rejects.toThrow(
      `no free port in FENCEPOST_PORT_RANGE ${held}-${held}: every port of it is in use`,
    );
  });

  test('a malformed or out-of-bounds value is refused at start with a message naming the variable', () => {
    expect(portRange({})).toBeNull();
    expect(portRange({ FENCEPOST_PORT_RANGE: '' })).toBeNull();
    expect(portRange({ FENCEPOST_PORT_RANGE: '20000-20999' })).toEqual([20000, 20999]);
    expect(portRange({ FENCEPOST_PORT_RANGE: ' 30000 - 30000 ' })).toEqual([30000, 30000]);
    for (const bad of ['20000', '20000:20999', 'a-b', '-5-10', '20000-', '20000-20999-1'])
      expect(() => portRange({ FENCEPOST_PORT_RANGE: bad }), bad).toThrow(
        /^FENCEPOST_PORT_RANGE: must be <low>-<high>, e\.g\. 20000-20999; got /,
      );
    for (const bad of ['80-2000', '20000-70000', '21000-20000'])
      expect(() => portRange({ FENCEPOST_PORT_RANGE: bad }), bad).toThrow(
        /^FENCEPOST_PORT_RANGE: must be two ports from 1024 to 65535, the low one first; got /,
      );
    // serve, elect --status-port 0 and the demo (and scripts/zookeeper.sh) check it before they start anything.
    for (const args of [
      ['serve', '--port', '0'],
      ['elect', '--zk', '127.0.0.1:1', '--path', '/p', '--status-port', '0', '--', 'true'],
      ['demo'],
    ]) {
      const r = run(args, { FENCEPOST_PORT_RANGE: '20000' });
      expect(r.status, args[0]).toBe(1);
      expect(r.stderr, args[0]).toBe(
        'fencepost: invalid configuration: FENCEPOST_PORT_RANGE: must be <low>-<high>, e.g. 20000-20999; got "20000"\n',
      );
    }
    expect(oneLineFailure(run(['serve'], { PORT: '0', FENCEPOST_PORT_RANGE: '21000-20000' }))).toBe(
      'fencepost: invalid configuration: FENCEPOST_PORT_RANGE: must be two ports from 1024 to 65535, the low one first; got 21000-20000',
    );
  });

  test('a server of ours asked for port 0 binds a port of the range, and another when the one picked is taken before the bind', async () => {
    const [lo, hi] = await someRange(40);
    const range: [number, number] = [lo, hi];
    // Between the pick and the bind another process takes the port: the bind fails, another is picked.
    const tried: number[] = [];
    const server = await listenInRange(0, range, async (port) => {
      tried.push(port);
      if (tried.length === 1) held.push(await listenOn(port)); // taken meanwhile
      return await listenOn(port);
    });
    try {
      const port = (server.address() as AddressInfo).port;
      expect(tried).toHaveLength(2);
      expect(port).toBe(tried[1]);
      for (const p of tried) expect(p >= lo && p <= hi, `${p} in ${lo}-${hi}`).toBe(true);
    } finally {
      await new Promise((r) => server.close(r));
    }
    // Bounded: taken at every attempt, it gives up after them, saying the port was taken.
    let attempts = 0;
    const always = await listenInRange(
      0,
      range,
      async (port) => {
        attempts++;
        held.push(await listenOn(port));
        return await listenOn(port);
      },
      { attempts: 3 },
    ).catch((e: unknown) => e);
    expect(attempts).toBe(3);
    expect(always).toBeInstanceOf(AggregateError);
    expect(isPortTaken(always)).toBe(true);
    // A port asked for, or no range: the port as given (0: the OS's choice).
    const given = await holdPort();
    expect(await listenInRange(given, range, async (port) => port)).toBe(given);
    expect(await listenInRange(0, null, async (port) => port)).toBe(0);
  });

  test('fencepost serve with every port of the range in use stops in one line naming the variable, before it uses the database', async () => {
    const port = await holdPort();
    const r = run(['serve', '--port', '0'], { DATABASE_URL: 'postgres://u:p@127.0.0.1:1/x', FENCEPOST_PORT_RANGE: `${port}-${port}` });
    expect(oneLineFailure(r)).toBe(
      `fencepost: cannot start: FENCEPOST_PORT_RANGE: no free port in ${port}-${port} for PORT: every port of it is in use`,
    );
  });

  test(
    'fencepost serve asked for port 0 binds its HTTP port, its SQL endpoint and its embedded Postgres inside the range',
    { timeout: 180_000 },
    async () => {
      const [lo, hi] = await someRange(100);
      const inRange = (port: number | null) => port !== null && port >= lo && port <= hi;
      const dataDir = join(dir, 'range-serve', 'pgdata');
      vi.stubEnv('FENCEPOST_PORT_RANGE', `${lo}-${hi}`);
      try {
        // A real `fencepost serve` (spawnProxy leaves the picking to it): PORT=0, FENCEPOST_PGWIRE_PORT=0,
        // no DATABASE_URL and no FENCEPOST_EMBEDDED_PG_PORT, so its embedded Postgres's port is picked too.
        const proxy = await spawnProxy(
          { DATABASE_URL: '', FENCEPOST_DATA_DIR: dataDir, FENCEPOST_EMBEDDED_PG_PORT: '', PORT: '0', FENCEPOST_PGWIRE_PORT: '0' },
          150_000,
        );
        try {
          expect(inRange(Number(new URL(proxy.url).port)), `${proxy.url} in ${lo}-${hi}`).toBe(true);
          expect(inRange(proxy.pgwirePort), `SQL endpoint ${proxy.pgwirePort} in ${lo}-${hi}`).toBe(true);
          // The embedded cluster's URL (recorded while it runs) names a port of the range, and the
          // Postgres answering there runs on this proxy's data folder.
          const superuser = readFileSync(join(dataDir, 'postgres.url'), 'utf8').trim();
          const pgPort = Number(new URL(superuser).port);
          expect(inRange(pgPort), `embedded Postgres ${pgPort} in ${lo}-${hi}`).toBe(true);
          const client = new pg.Client({ connectionString: superuser });
          await client.connect();
          const { rows } = await client.query<{ data_directory: string }>('SHOW data_directory');
          await client.end();
          expect(rows[0]?.data_directory).toBe(dataDir);
        } finally {
          expect(await proxy.stop()).toBe(0);
        }
      } finally {
        vi.unstubAllEnvs();
      }
    },
  );

  test('proxies started in this process, and servers tests open themselves, take their ports from the range', async () => {
    const [lo, hi] = await someRange(100);
    const inRange = (port: number | null) => port !== null && port >= lo && port <= hi;
    vi.stubEnv('FENCEPOST_PORT_RANGE', `${lo}-${hi}`);
    const db = await createTestDatabase();
    try {
      const sql = await startSqlProxy(db);
      try {
        expect(inRange(Number(new URL(sql.proxy.url).port)), `${sql.proxy.url} in ${lo}-${hi}`).toBe(true);
        expect(inRange(sql.port), `SQL endpoint ${sql.port} in ${lo}-${hi}`).toBe(true);
      } finally {
        await sql.close();
      }
      const app = testApp(db.pool);
      try {
        const url = await listen(app);
        expect(inRange(Number(new URL(url).port)), `${url} in ${lo}-${hi}`).toBe(true);
      } finally {
        await app.close();
      }
      const raw = createServer();
      try {
        const port = await listenFree(raw);
        expect(inRange(port), `${port} in ${lo}-${hi}`).toBe(true);
      } finally {
        await new Promise((r) => raw.close(r));
      }
    } finally {
      vi.unstubAllEnvs();
      await db.drop();
    }
  });

  test('fencepost elect --status-port 0 listens inside the range', { timeout: 60_000 }, async () => {
    const [lo, hi] = await someRange(40);
    const args = ['--zk', inject('zkConnect'), '--path', uniquePath('ports'), '--status-port', '0', '--status-host', '127.0.0.1'];
    const child = spawn(process.execPath, [BIN, 'elect', ...args, '--', process.execPath, '-e', 'setTimeout(() => {}, 60000)'], {
      env: { ...process.env, FENCEPOST_PORT_RANGE: `${lo}-${hi}`, FENCEPOST_LOG_LEVEL: 'info' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    try {
      const listening = () => err.split('\n').find((l) => l.includes('"status server listening'));
      await expect.poll(listening, { timeout: 30_000 }).toBeDefined();
      const port = (JSON.parse(listening()!) as { port: number }).port;
      expect(port >= lo && port <= hi, `${port} in ${lo}-${hi}`).toBe(true);
      expect((await fetch(`http://127.0.0.1:${port}/healthz`)).status).toBe(200);
    } finally {
      child.kill('SIGTERM');
      await exited;
    }
  });

  test('the local ZooKeeper (scripts/zookeeper.sh, the demo, the tests) takes its ports from the range', { timeout: 60_000 }, async () => {
    const [lo, hi] = await someRange(60);
    vi.stubEnv('FENCEPOST_PORT_RANGE', `${lo}-${hi}`);
    const baseDir = mkdtempSync(join(dir, 'zk-range-'));
    try {
      const zk = await LocalZooKeeper.start({ servers: 1, baseDir });
      try {
        const n = zk.node(1);
        for (const port of [n.clientPort, n.quorumPort, n.electionPort])
          expect(port >= lo && port <= hi, `${port} in ${lo}-${hi}`).toBe(true);
        expect(await fourLetterWord(n.clientPort, 'conf')).toContain(`dataDir=${join(baseDir, 'zk1')}/`);
      } finally {
        await zk.stop();
      }
    } finally {
      vi.unstubAllEnvs();
    }
  });
});
