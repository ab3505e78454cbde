// Ports as the harness sees them: where a server the harness opens itself listens (a free port, of
// FENCEPOST_PORT_RANGE when set), a port nothing listens on, whether a process itself listens on a
// port, and the words a server prints when its port is taken. Picking ports for the servers we start
// (freePort, startOnFreePorts, PortTakenError, listenInRange) is in src/ports.ts.
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { connect, type Server } from 'node:net';
import { listenInRange, portRange } from '../src/ports.ts';

/**
 * Runs `listen` (a server of the harness's, binding the port it is given) on a free port: one of
 * FENCEPOST_PORT_RANGE's when set, picked again when taken meanwhile; else port 0, the OS's choice.
 * What `fencepost serve` does with port 0, for the servers tests and tools open themselves.
 */
export async function onFreePort<T>(listen: (port: number) => Promise<T>): Promise<T> {
  return await listenInRange(0, portRange(), listen);
}

/** Listens `server` (node:net or node:http) on a free port of `host` (`onFreePort`); the port. */
export async function listenFree(server: Server, host = '127.0.0.1'): Promise<number> {
  return await onFreePort(
    (port) =>
      new Promise<number>((resolve, reject) => {
        server.once('error', reject);
        server.listen({ host, port }, () => {
          server.off('error', reject);
          const address = server.address();
          resolve(typeof address === 'object' && address ? address.port : port);
        });
      }),
  );
}

/**
 * FENCEPOST_PORT_RANGE as this process has it, or nothing: for the settings of a proxy started in
 * this process (loadConfig reads only the settings it is given), so its port 0 keeps to the range too.
 */
export function portRangeEnv(): Record<string, string> {
  const range = process.env.FENCEPOST_PORT_RANGE;
  return range === undefined || range === '' ? {} : { FENCEPOST_PORT_RANGE: range };
}

/**
 * A loopback port that refuses connections, for "nothing listens there". Below 1024: no server a
 * test starts is given one (freePort draws from 10000 up, listen(0) from the ephemeral range), so
 * it still refuses when the test connects. Not one of the ports fetch() will not dial.
 */
export async function closedPort(): Promise<number> {
  for (let port = 1023; port > 0; port--) {
    if (!FETCH_BAD_PORTS.has(port) && (await refuses(port))) return port;
  }
  throw new Error('every port below 1024 on 127.0.0.1 accepts connections');
}

/** The Fetch standard's "bad ports" below 1024: fetch() fails on them without connecting. */
const FETCH_BAD_PORTS = new Set([
  1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79, 87, 95, 101, 102, 103, 104, 109, 110, 111, 113, 115, 117,
  119, 123, 135, 137, 139, 143, 161, 179, 389, 427, 465, 512, 513, 514, 515, 526, 530, 531, 532, 540, 548, 554, 556, 563, 587, 601, 636,
  989, 990, 993, 995,
]);

function refuses(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    s.once('connect', () => {
      s.destroy();
      resolve(false);
    });
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
  });
}

/**
 * What a server prints when its port is taken: the OS's words (ZooKeeper's JVM, Postgres,
 * PgBouncer, HAProxy, Patroni), Postgres's for another postmaster's socket lock file of the same
 * port number, or `fencepost serve`'s one line naming the port's setting.
 */
export const PORT_TAKEN_TEXT =
  /Address already in use|EADDRINUSE|lock file "[^"]*\.s\.PGSQL\.\d+\.lock" already exists|cannot start: (?:PORT|--port|FENCEPOST_PGWIRE_PORT|FENCEPOST_EMBEDDED_PG_PORT): \S+ is already in use/;

/** The line of `output` that says a port was taken, or null. */
export function portTakenLine(output: string): string | null {
  return (
    output
      .split('\n')
      .find((l) => PORT_TAKEN_TEXT.test(l))
      ?.trim() ?? null
  );
}

/**
 * Process `pid` itself listens on TCP `port` (Linux: its socket descriptors against
 * /proc/net/tcp and tcp6), not another process that holds the port: for a server of ours that
 * logs nothing when it listens.
 */
export function listensOn(pid: number, port: number): boolean {
  let inodes: Set<string>;
  try {
    inodes = new Set(
      readdirSync(`/proc/${pid}/fd`).flatMap((fd) => {
        try {
          return [/^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1] ?? ''].filter(Boolean);
        } catch {
          return []; // closed meanwhile
        }
      }),
    );
  } catch {
    return false; // gone
  }
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  for (const table of [`/proc/${pid}/net/tcp`, `/proc/${pid}/net/tcp6`]) {
    let rows: string[];
    try {
      rows = readFileSync(table, 'utf8').split('\n').slice(1);
    } catch {
      continue;
    }
    for (const row of rows) {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      const f = row.trim().split(/\s+/);
      if (f[1]?.endsWith(`:${hexPort}`) && f[3] === '0A' && inodes.has(f[9] ?? '')) return true;
    }
  }
  return false;
}
