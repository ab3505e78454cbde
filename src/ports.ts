// Free ports: for `fencepost serve`'s doors and embedded Postgres when asked for port 0, and for the
// local servers the demo, the tests, chaos runs and benches start. A server of ours binds port 0,
// or with FENCEPOST_PORT_RANGE a port of the range (`listenInRange`). A server we do not write
// (ZooKeeper, Postgres, PgBouncer, HAProxy, Patroni) needs its number before it binds: it starts on
// a picked port, and when that was taken meanwhile (another test file, another run on the
// machine), on another (`startOnFreePorts`). What only the harness needs (a closed port, who
// listens on a port, a server's words for a taken port) is in tools/ports.ts. Outside the layers:
// src/proxy, src/fence and src/demo import it.
// FENCEPOST_PORT_RANGE (`20000-20999`) keeps every port picked here inside one range: on a machine
// shared with others, each gets a range of its own.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { ConfigError } from './config-error.ts';

/** Below this, ports are left to services with well-known or registered numbers. */
const LOWEST_PORT = 10_000;

/** Starts on fresh ports after a port was taken, at most this many times in all. */
const DEFAULT_ATTEMPTS = 5;

/** FENCEPOST_PORT_RANGE's two ends, both included. */
export type PortRange = [low: number, high: number];

/**
 * A port free on 127.0.0.1 now, for a server that needs its number before it binds (and again after
 * each restart): one of FENCEPOST_PORT_RANGE's when set. Free now is no promise: bind it through
 * `startOnFreePorts`, which picks again when it was taken meanwhile. Without a range, drawn from
 * outside the kernel's ephemeral range: listen(0) and outgoing connections anywhere on the machine
 * are handed ports from that range, so none of them can take this one while its server restarts.
 */
export async function freePort(env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const range = portRange(env);
  if (range !== null) return await freePortIn(range);
  const ports = portsOutside(ephemeralRange()).flatMap(([lo, hi]) => Array.from({ length: hi - lo + 1 }, (_, i) => lo + i));
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = ports[Math.floor(Math.random() * ports.length)]!;
    if (await bindable(port)) return port;
  }
  throw new Error('no free port outside the ephemeral range');
}

/**
 * A port of `range` free on 127.0.0.1 now; PortRangeFullError when none is. Every port of the range,
 * in random order: a small range is used up before it is called full.
 */
export async function freePortIn(range: PortRange): Promise<number> {
  const [lo, hi] = range;
  const ports = Array.from({ length: hi - lo + 1 }, (_, i) => lo + i);
  for (let i = ports.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [ports[i], ports[j]] = [ports[j]!, ports[i]!];
  }
  for (const port of ports) if (await bindable(port)) return port;
  throw new PortRangeFullError(range);
}

/** Every port of FENCEPOST_PORT_RANGE is in use. */
export class PortRangeFullError extends Error {
  constructor(readonly range: PortRange) {
    super(`no free port in FENCEPOST_PORT_RANGE ${range[0]}-${range[1]}: every port of it is in use`);
    this.name = 'PortRangeFullError';
  }
}

/**
 * Listens a server of ours (`listen` binds the port it is given): on `port`; for port 0 with a
 * `range`, on a free port of the range, picked again when it was taken between the pick and the
 * bind (`startOnFreePort`: a bounded number of times); port 0 without a range, on the OS's choice.
 */
export async function listenInRange<T>(
  port: number,
  range: PortRange | null,
  listen: (port: number) => Promise<T>,
  opts: Pick<PortPicking, 'attempts'> = {},
): Promise<T> {
  if (port !== 0 || range === null) return await listen(port);
  return await startOnFreePort(listen, { ...opts, pick: () => freePortIn(range) });
}

/** Lowest port FENCEPOST_PORT_RANGE may name: below it, ports need privileges or belong to services. */
const LOWEST_RANGE_PORT = 1024;

/**
 * FENCEPOST_PORT_RANGE, `<low>-<high>` (e.g. `20000-20999`): the ports port 0 means for `fencepost
 * serve` (PORT, FENCEPOST_PGWIRE_PORT, the embedded Postgres's), and those the demo, the local
 * ZooKeeper (scripts/zookeeper.sh) and the tests' servers are picked from; null when unset (then
 * freePort picks outside the ephemeral range, and servers of ours bind port 0). A malformed value
 * is a ConfigError naming the variable: read it at start, before anything runs.
 */
export function portRange(env: NodeJS.ProcessEnv = process.env): PortRange | null {
  const raw = env.FENCEPOST_PORT_RANGE;
  if (raw === undefined || raw.trim() === '') return null;
  const m = /^\s*(\d{1,5})\s*-\s*(\d{1,5})\s*$/.exec(raw);
  if (!m) throw new ConfigError('FENCEPOST_PORT_RANGE', `must be <low>-<high>, e.g. 20000-20999; got ${JSON.stringify(raw)}`);
  const lo = Number(m[1]);
  const hi = Number(m[2]);
  if (lo < LOWEST_RANGE_PORT || hi > 65_535 || lo > hi)
    throw new ConfigError(
      'FENCEPOST_PORT_RANGE',
      `must be two ports from ${LOWEST_RANGE_PORT} to 65535, the low one first; got ${lo}-${hi}`,
    );
  return [lo, hi];
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

/** A server could not start because one of its ports is in use: `startOnFreePorts` tries others. */
export class PortTakenError extends Error {
  readonly code = 'EADDRINUSE';
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'PortTakenError';
  }
}

/** Those of `ports` that 127.0.0.1 cannot bind now: after a server of ours exited, someone else's. */
export async function heldPorts(ports: number[]): Promise<number[]> {
  const held: number[] = [];
  for (const port of ports) if (!(await bindable(port))) held.push(port);
  return held;
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
      if (attempt >= attempts)
        throw new AggregateError(
          failures,
          `no start on free ports after ${attempts} attempts, each port taken before the server bound it`,
          { cause: err },
        );
    }
  }
}

/** `startOnFreePorts` for a server with one port. */
export function startOnFreePort<T>(start: (port: number) => Promise<T>, opts: PortPicking = {}): Promise<T> {
  return startOnFreePorts(1, ([port]) => start(port!), opts);
}
