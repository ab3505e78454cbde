// Starts real ZooKeeper servers (Debian's `zookeeper` package: its jar, run on Java) for the demo,
// tests and chaos runs: a standalone server or an N-server ensemble on loopback, each with its own
// data dir.
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants, mkdtempSync, mkdirSync, writeFileSync, rmSync, existsSync } from 'node:fs';
import { connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { PortTakenError, heldPorts, startOnFreePorts, type PortPicking } from '../ports.ts';

export const ZOOKEEPER_JAR = process.env.ZOOKEEPER_JAR ?? '/usr/share/java/zookeeper.jar';
const CLASSPATH_EXTRA = ['/etc/zookeeper/conf'];

/** Why no local server can start here (no ZooKeeper jar, or no `java` on PATH), with what to install; null when one can. */
export function localZooKeeperMissing(): string | null {
  if (!existsSync(ZOOKEEPER_JAR))
    return `${ZOOKEEPER_JAR} is missing: install Debian's zookeeper package (\`apt-get install zookeeper\`, which brings Java), or set ZK_CONNECT to a running ZooKeeper`;
  if (!onPath('java'))
    return 'java is not on PATH: install Java (`apt-get install default-jre-headless`), or set ZK_CONNECT to a running ZooKeeper';
  return null;
}

function onPath(command: string): boolean {
  return (process.env.PATH ?? '').split(delimiter).some((dir) => {
    try {
      accessSync(join(dir || '.', command), constants.X_OK);
      return true;
    } catch {
      return false;
    }
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
  /** How the ports are picked (tests of the retry hand in a taken one). */
  ports?: PortPicking;
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

  /**
   * Starts the servers on picked ports; when one was taken before its server bound it, the whole
   * set starts again on fresh ports and fresh data dirs (`startOnFreePorts`).
   */
  static async start(opts: LocalZooKeeperOptions = {}): Promise<LocalZooKeeper> {
    const missing = localZooKeeperMissing();
    if (missing !== null) throw new Error(`cannot start a local ZooKeeper: ${missing}`);
    const servers = opts.servers ?? 1;
    const tick = opts.tickTimeMs ?? 500;
    const baseDir = opts.baseDir ?? mkdtempSync(join(tmpdir(), 'fencepost-zk-'));
    try {
      return await startOnFreePorts(servers * 3, (ports) => LocalZooKeeper.startOn(ports, servers, tick, baseDir, opts), opts.ports);
    } catch (err) {
      if (opts.baseDir === undefined) rmSync(baseDir, { recursive: true, force: true });
      throw err;
    }
  }

  private static async startOn(
    ports: number[],
    servers: number,
    tick: number,
    baseDir: string,
    opts: LocalZooKeeperOptions,
  ): Promise<LocalZooKeeper> {
    const nodes: ZooKeeperNodeSpec[] = [];
    for (let id = 1; id <= servers; id++) {
      const dataDir = join(baseDir, `zk${id}`);
      rmSync(dataDir, { recursive: true, force: true }); // an earlier attempt's
      mkdirSync(dataDir, { recursive: true });
      const [clientPort, quorumPort, electionPort] = ports.slice((id - 1) * 3, id * 3) as [number, number, number];
      nodes.push({ id, clientPort, quorumPort, electionPort, dataDir, cfgPath: join(baseDir, `zoo${id}.cfg`) });
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
    const failures = started.flatMap((r) => (r.status === 'rejected' ? [r.reason as unknown] : []));
    if (failures.length > 0) {
      await zk.stop({ keepData: true }); // no JVM outlives a failed start; start() removes the dir
      throw failures.find((e) => e instanceof PortTakenError) ?? failures[0];
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
    let output = '';
    const onData = (b: Buffer) => {
      output = (output + b.toString()).slice(-65_536);
      this.log(`[zk${id}] ${b.toString().trimEnd()}`);
    };
    child.stdout?.on('data', onData);
    child.stderr?.on('data', onData);
    this.procs.set(id, child);
    child.on('exit', () => {
      if (this.procs.get(id) === child) this.procs.delete(id);
    });
    // Serving once the client port answers with this server's data dir (another server may hold
    // the port) and a mode (an ensemble member: once it has joined a quorum).
    const deadline = Date.now() + timeoutMs;
    // ZooKeeper logs nothing here (no SLF4J binding): a port taken shows as the JVM exiting while
    // another process holds one of its ports, or another server answering on its client port.
    const ports = [n.clientPort, n.quorumPort, n.electionPort];
    const taken = async (): Promise<PortTakenError | null> => {
      const held = await heldPorts(ports);
      return held.length > 0
        ? new PortTakenError(`ZooKeeper server ${id} exited during start: port ${held.join(', ')} held by another process`)
        : null;
    };
    let foreign = false;
    for (;;) {
      if (!this.procs.has(id))
        throw (await taken()) ?? new Error(`ZooKeeper server ${id} exited during start (code ${child.exitCode}):\n${output}`);
      const conf = await fourLetterWord(n.clientPort, 'conf').catch(() => '');
      if (conf.includes(`dataDir=${n.dataDir}/`)) {
        const reply = await fourLetterWord(n.clientPort, 'srvr').catch(() => '');
        if (reply.includes('Mode:')) return;
      } else if (conf.includes('dataDir=')) {
        foreign = true;
      }
      if (Date.now() > deadline) {
        await this.stopNode(id, 'SIGKILL');
        if (foreign) throw new PortTakenError(`ZooKeeper server ${id}: another server answers on port ${n.clientPort}`);
        throw (await taken()) ?? new Error(`ZooKeeper server ${id} did not start within ${timeoutMs} ms:\n${output}`);
      }
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
