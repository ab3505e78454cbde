// Ports for the servers tests start (src/ports.ts, tools/ports.ts): a server we do not write starts on a picked
// port, and when another process holds that port, on another one; what then answers is that server.
// Each test hands in the held port as the first pick.
import { afterAll, describe, expect, test, vi } from 'vitest';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, connect, type AddressInfo, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { ephemeralRange, freePort, isPortTaken, portRange, startOnFreePort, type PortPicking } from '../src/ports.ts';
import { closedPort, portTakenLine } from '../tools/ports.ts';
import { startPostgres } from '../tools/postgres.ts';
import { startPgbouncer } from '../tools/pgbouncer.ts';
import { LocalZooKeeper, fourLetterWord } from '../src/demo/local-zookeeper.ts';
import { createTestDatabase } from './support/db.ts';
import { run } from './support/cli.ts';
import { listen, spawnProxy, testApp } from './support/proxy.ts';

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
    // The demo and scripts/zookeeper.sh check it before they start anything.
    const demo = run(['demo'], { FENCEPOST_PORT_RANGE: '20000' });
    expect(demo.status).toBe(1);
    expect(demo.stderr).toBe(
      'fencepost: invalid configuration: FENCEPOST_PORT_RANGE: must be <low>-<high>, e.g. 20000-20999; got "20000"\n',
    );
  });

  test('the proxies tests start, as a process or in this one, take their ports from the range', { timeout: 120_000 }, async () => {
    const [lo, hi] = await someRange(100);
    const inRange = (port: number | null) => port !== null && port >= lo && port <= hi;
    vi.stubEnv('FENCEPOST_PORT_RANGE', `${lo}-${hi}`);
    const db = await createTestDatabase();
    try {
      const proxy = await spawnProxy({ DATABASE_URL: db.url, FENCEPOST_PGWIRE_PORT: '0' });
      try {
        expect(inRange(Number(new URL(proxy.url).port)), `${proxy.url} in ${lo}-${hi}`).toBe(true);
        expect(inRange(proxy.pgwirePort), `SQL endpoint ${proxy.pgwirePort} in ${lo}-${hi}`).toBe(true);
      } finally {
        await proxy.stop();
      }
      const app = testApp(db.pool);
      try {
        const url = await listen(app);
        expect(inRange(Number(new URL(url).port)), `${url} in ${lo}-${hi}`).toBe(true);
      } finally {
        await app.close();
      }
    } finally {
      vi.unstubAllEnvs();
      await db.drop();
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
