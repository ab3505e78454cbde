// Ports for the servers that tests, the demo, chaos runs and benches start. A server of ours binds
// port 0 and reports the port it got. A server we do not write (Postgres, ZooKeeper, PgBouncer,
// HAProxy, Patroni) needs its number before it binds: it starts on a picked port, and when that was
// taken meanwhile (another test file, another run on the machine), on another (`startOnFreePorts`).
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { createServer, connect } from 'node:net';

/** Below this, ports are left to services with well-known or registered numbers. */
const LOWEST_PORT = 10_000;

/** Starts on fresh ports after a port was taken, at most this many times in all. */
const DEFAULT_ATTEMPTS = 5;

/**
 * A port free on 127.0.0.1 now, for a server that needs its number before it binds (and again after
 * each restart). Free now is no promise: bind it through `startOnFreePorts`, which picks again when
 * it was taken meanwhile. Drawn from outside the kernel's ephemeral range: listen(0) and outgoing
 * connections anywhere on the machine are handed ports from that range, so none of them can take
 * this one while its server restarts.
 */
export async function freePort(): Promise<number> {
  const ports = portsOutside(ephemeralRange()).flatMap(([lo, hi]) => Array.from({ length: hi - lo + 1 }, (_, i) => lo + i));
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = ports[Math.floor(Math.random() * ports.length)]!;
    if (await bindable(port)) return port;
  }
  throw new Error('no free port outside the ephemeral range');
}

/** The kernel's ephemeral range (Linux: ip_local_port_range; elsewhere the IANA dynamic range). */
export function ephemeralRange(): [number, number] {
  try {
    const [lo, hi] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (Number.isInteger(lo) && Number.isInteger(hi)) return [lo!, hi!];
  } catch {
    // not Linux
  }
  return [49_152, 65_535];
}

function portsOutside([lo, hi]: [number, number]): [number, number][] {
  const ranges: [number, number][] = [];
  if (lo - 1 >= LOWEST_PORT) ranges.push([LOWEST_PORT, lo - 1]);
  if (hi + 1 <= 65_535) ranges.push([Math.max(hi + 1, LOWEST_PORT), 65_535]);
  if (ranges.length === 0) throw new Error(`the ephemeral range ${lo}-${hi} leaves no port above ${LOWEST_PORT}`);
  return ranges;
}

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', () => resolve(false));
    srv.listen({ host: '127.0.0.1', port, exclusive: true }, () => srv.close(() => resolve(true)));
  });
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
  1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79, 87, 95, 101, 102, 103, 104, 109, 110, 111, 113, 115, 117, 119, 123, 135, 137, 139, 143, 161, 179, 389, 427, 465, 512, 513,
  514, 515, 526, 530, 531, 532, 540, 548, 554, 556, 563, 587, 601, 636, 989, 990, 993, 995,
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

/** A server could not start because one of its ports is in use: `startOnFreePorts` tries others. */
export class PortTakenError extends Error {
  readonly code = 'EADDRINUSE';
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'PortTakenError';
  }
}

/**
 * What a server prints when its port is taken: the OS's words (ZooKeeper's JVM, Postgres,
 * PgBouncer, HAProxy, Patroni), Postgres's for another postmaster's socket lock file of the same
 * port number, or `fencepost serve`'s one line naming the port's setting.
 */
export const PORT_TAKEN_TEXT = /Address already in use|EADDRINUSE|lock file "[^"]*\.s\.PGSQL\.\d+\.lock" already exists|cannot start: (?:PORT|--port|FENCEPOST_PGWIRE_PORT|FENCEPOST_EMBEDDED_PG_PORT): \S+ is already in use/;

/** The line of `output` that says a port was taken, or null. */
export function portTakenLine(output: string): string | null {
  return output.split('\n').find((l) => PORT_TAKEN_TEXT.test(l))?.trim() ?? null;
}

/** Those of `ports` that 127.0.0.1 cannot bind now: after a server of ours exited, someone else's. */
export async function heldPorts(ports: number[]): Promise<number[]> {
  const held: number[] = [];
  for (const port of ports) if (!(await bindable(port))) held.push(port);
  return held;
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

/** The error, or one of its causes, says a port was in use (Node's listen errors included). */
export function isPortTaken(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 10; e = e.cause, depth++) {
    if ((e as NodeJS.ErrnoException).code === 'EADDRINUSE') return true;
  }
  return false;
}

export interface PortPicking {
  /** Starts tried in all (default 5). */
  attempts?: number;
  /** Hands out the candidates, one call per port (default freePort). */
  pick?: () => Promise<number>;
}

/**
 * Starts a server on `count` picked ports; when the start fails because a port was taken between
 * the pick and the bind (`isPortTaken`), starts again on fresh ports, a bounded number of times.
 * `start` cleans up after its own failure, and throws PortTakenError only when it knows the port
 * was the cause (the server said so, or what answers on the port is not the server it started).
 */
export async function startOnFreePorts<T>(count: number, start: (ports: number[]) => Promise<T>, opts: PortPicking = {}): Promise<T> {
  const attempts = opts.attempts ?? DEFAULT_ATTEMPTS;
  const pick = opts.pick ?? freePort;
  const failures: unknown[] = [];
  for (let attempt = 1; ; attempt++) {
    const ports: number[] = [];
    while (ports.length < count) {
      const port = await pick();
      if (!ports.includes(port)) ports.push(port);
    }
    try {
      return await start(ports);
    } catch (err) {
      if (!isPortTaken(err)) throw err;
      failures.push(err);
      if (attempt >= attempts) throw new AggregateError(failures, `no start on free ports after ${attempts} attempts, each port taken before the server bound it`, { cause: err });
    }
  }
}

/** `startOnFreePorts` for a server with one port. */
export function startOnFreePort<T>(start: (port: number) => Promise<T>, opts: PortPicking = {}): Promise<T> {
  return startOnFreePorts(1, ([port]) => start(port!), opts);
}
