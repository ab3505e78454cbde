// Starts real ZooKeeper servers (Debian's `zookeeper` package) for tests, the demo and chaos runs:
// a standalone server or an N-server ensemble on loopback, each with its own data dir.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, writeFileSync, rmSync, existsSync } from 'node:fs';
import { createServer, connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const ZOOKEEPER_JAR = process.env.ZOOKEEPER_JAR ?? '/usr/share/java/zookeeper.jar';
const CLASSPATH_EXTRA = ['/etc/zookeeper/conf'];

/**
 * A port free on 127.0.0.1 now, for a server started a moment later and again after each restart
 * (a chaos run's proxies, Postgres, ZooKeeper). Drawn from outside the kernel's ephemeral range:
 * listen(0) and outgoing connections anywhere on the machine (another test's servers) are handed
 * ports from that range, so none of them can take this one while its server is down.
 */
export async function freePort(): Promise<number> {
  const ports = portsOutside(ephemeralRange()).flatMap(([lo, hi]) => Array.from({ length: hi - lo + 1 }, (_, i) => lo + i));
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = ports[Math.floor(Math.random() * ports.length)]!;
    if (await bindable(port)) return port;
  }
  throw new Error('no free port outside the ephemeral range');
}

/** Below this, ports are left to services with well-known or registered numbers. */
const LOWEST_PORT = 10_000;

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

export interface ZooKeeperNodeSpec {
  id: number;
  clientPort: number;
  quorumPort: number;
  electionPort: number;
  dataDir: string;
  cfgPath: string;
}

export interface LocalZooKeeperOptions {
  /** 1 = standalone, 3 = ensemble. */
  servers?: number;
  tickTimeMs?: number;
  /** Lower bound ZooKeeper accepts for session timeouts is 2 × tick; upper bound 20 × tick by default. */
  maxSessionTimeoutMs?: number;
  baseDir?: string;
  log?: (line: string) => void;
}

/** A running standalone server or ensemble; each member can be stopped and restarted. */
export class LocalZooKeeper {
  readonly nodes: ZooKeeperNodeSpec[];
  readonly tickTimeMs: number;
  private readonly procs = new Map<number, ChildProcess>();
  private readonly baseDir: string;
  private readonly log: (line: string) => void;

  private constructor(nodes: ZooKeeperNodeSpec[], tickTimeMs: number, baseDir: string, log: (line: string) => void) {
    this.nodes = nodes;
    this.tickTimeMs = tickTimeMs;
    this.baseDir = baseDir;
    this.log = log;
  }

  static async start(opts: LocalZooKeeperOptions = {}): Promise<LocalZooKeeper> {
    if (!existsSync(ZOOKEEPER_JAR)) {
      throw new Error(`ZooKeeper jar not found at ${ZOOKEEPER_JAR}: install Debian's "zookeeper" package or set ZK_CONNECT`);
    }
    const servers = opts.servers ?? 1;
    const tick = opts.tickTimeMs ?? 500;
    const baseDir = opts.baseDir ?? mkdtempSync(join(tmpdir(), 'fencepost-zk-'));
    const nodes: ZooKeeperNodeSpec[] = [];
    for (let id = 1; id <= servers; id++) {
      const dataDir = join(baseDir, `zk${id}`);
      mkdirSync(dataDir, { recursive: true });
      nodes.push({
        id,
        clientPort: await freePort(),
        quorumPort: await freePort(),
        electionPort: await freePort(),
        dataDir,
        cfgPath: join(baseDir, `zoo${id}.cfg`),
      });
    }
    for (const n of nodes) {
      const lines = [
        `tickTime=${tick}`,
        `dataDir=${n.dataDir}`,
        `clientPort=${n.clientPort}`,
        `clientPortAddress=127.0.0.1`,
        'admin.enableServer=false',
        'initLimit=10',
        'syncLimit=5',
        `maxSessionTimeout=${opts.maxSessionTimeoutMs ?? 60_000}`,
        '4lw.commands.whitelist=*',
        'maxClientCnxns=0',
      ];
      if (servers > 1) {
        writeFileSync(join(n.dataDir, 'myid'), `${n.id}\n`);
        for (const m of nodes) lines.push(`server.${m.id}=127.0.0.1:${m.quorumPort}:${m.electionPort}`);
      }
      writeFileSync(n.cfgPath, lines.join('\n') + '\n');
    }
    const zk = new LocalZooKeeper(nodes, tick, baseDir, opts.log ?? (() => {}));
    const started = await Promise.allSettled(nodes.map((n) => zk.startNode(n.id)));
    const failure = started.find((r) => r.status === 'rejected');
    if (failure) {
      await zk.stop({ keepData: opts.baseDir !== undefined }); // no JVM outlives a failed start
      throw failure.reason;
    }
    return zk;
  }

  /** Connect string for all members, e.g. `127.0.0.1:2181,127.0.0.1:2182`. */
  get connectString(): string {
    return this.nodes.map((n) => `127.0.0.1:${n.clientPort}`).join(',');
  }

  node(id: number): ZooKeeperNodeSpec {
    const n = this.nodes.find((x) => x.id === id);
    if (!n) throw new Error(`no ZooKeeper server ${id}`);
    return n;
  }

  isRunning(id: number): boolean {
    return this.procs.has(id);
  }

  async startNode(id: number, timeoutMs = 60_000): Promise<void> {
    const n = this.node(id);
    if (this.procs.has(id)) return;
    const child = spawn(
      'java',
      [
        '-Xmx256m',
        '-XX:+UseSerialGC',
        '-Dzookeeper.log.dir=' + n.dataDir,
        '-Dzookeeper.root.logger=WARN,CONSOLE',
        '-cp',
        [...CLASSPATH_EXTRA, ZOOKEEPER_JAR].join(':'),
        'org.apache.zookeeper.server.quorum.QuorumPeerMain',
        n.cfgPath,
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const onData = (b: Buffer) => this.log(`[zk${id}] ${b.toString().trimEnd()}`);
    child.stdout?.on('data', onData);
    child.stderr?.on('data', onData);
    this.procs.set(id, child);
    child.on('exit', () => {
      if (this.procs.get(id) === child) this.procs.delete(id);
    });
    // Standalone: serving once the port answers `ruok`. Ensemble member: once it reports a mode.
    const deadline = Date.now() + timeoutMs;
    const quorumMember = this.nodes.length > 1;
    for (;;) {
      if (!this.procs.has(id)) throw new Error(`ZooKeeper server ${id} exited during start`);
      const reply = await fourLetterWord(n.clientPort, 'srvr').catch(() => '');
      if (reply.includes('Mode:') && (!quorumMember || !reply.includes('not currently serving'))) return;
      if (quorumMember && reply.includes('Mode:')) return;
      if (Date.now() > deadline) throw new Error(`ZooKeeper server ${id} did not start within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Stops one member; `signal` SIGKILL simulates a crash. */
  async stopNode(id: number, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    const child = this.procs.get(id);
    if (!child) return;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
    this.procs.delete(id);
  }

  async restartNode(id: number): Promise<void> {
    await this.stopNode(id);
    await this.startNode(id);
  }

  /** Reports the member's mode (`leader`, `follower`, `standalone`) or null when down. */
  async mode(id: number): Promise<string | null> {
    const reply = await fourLetterWord(this.node(id).clientPort, 'srvr').catch(() => '');
    const m = /Mode: (\w+)/.exec(reply);
    return m?.[1] ?? null;
  }

  async stop(opts: { keepData?: boolean } = {}): Promise<void> {
    await Promise.all(this.nodes.map((n) => this.stopNode(n.id)));
    if (!opts.keepData) rmSync(this.baseDir, { recursive: true, force: true });
  }
}

/** Sends a ZooKeeper four-letter command and returns the whole reply. */
export async function fourLetterWord(port: number, cmd: string, timeoutMs = 2000): Promise<string> {
  return await new Promise((resolve, reject) => {
    const sock = tcpConnect({ host: '127.0.0.1', port });
    let out = '';
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error('four-letter word timed out'));
    }, timeoutMs);
    sock.on('connect', () => sock.write(cmd));
    sock.on('data', (d) => (out += d.toString()));
    sock.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    sock.on('close', () => {
      clearTimeout(timer);
      resolve(out);
    });
  });
}
