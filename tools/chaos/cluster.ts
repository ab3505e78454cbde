// The system under test for a chaos run, all on loopback: an embedded Postgres, a 3-server
// ZooKeeper ensemble, P `fencepost serve` processes, and N chaos writer processes, each reaching
// every ZooKeeper server through a TcpProxy of its own (so one writer can be cut off). Every
// component can be stopped and started again in place (same ports, same data), which is what the
// nemesis does to it. Each proxy also serves its SQL endpoint (FENCEPOST_PGWIRE_PORT), and the
// open-mode client login may write fencepost.objects, so writers of the `sql` and `tx` doors write
// the rows the checker reads. Postgres and every process log under logs/.
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { startEmbeddedPostgres, type RunningPostgres } from '../../src/fence/embedded-postgres.ts';
import { PortTakenError, startOnFreePorts } from '../../src/ports.ts';
import { portTakenLine } from '../ports.ts';
import { startPostgres } from '../postgres.ts';
import { listeningPorts } from '../serve-listening.ts';
import type { FenceMode } from '../unsafe-fence.ts';
import { TcpProxy } from '../faults/tcp-proxy.ts';
import { LocalZooKeeper } from '../../src/demo/local-zookeeper.ts';
import type { NemesisTarget } from './nemesis.ts';
import { PAUSE_REQUEST_MS, type WriterEvent } from './writer.ts';
import type { Door } from './history.ts';
import { grantObjectWrites } from '../../src/demo/sql-door.ts';
import { TX_DEFAULTS } from '../../src/proxy/config.ts';
import pg from 'pg';

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'fencepost.js');
const TOOLS = ['--import', 'tsx', join(import.meta.dirname, '..', 'cli.ts')];

export interface ClusterOptions {
  /** Run directory: history, logs, data. Its parent must be traversable by the postgres user. */
  dir: string;
  writers: number;
  /** Door of each writer slot (cycled); default all `http`. */
  doors?: readonly Door[];
  proxies: number;
  fenceKeys: readonly string[];
  /** Unique ZooKeeper path under which each fence key gets its election. */
  electionRoot: string;
  fenceMode: FenceMode;
  sessionTimeoutMs: number;
  /** Writers' pause between writes, and the synchronous work before each send. */
  intervalMs: number;
  workMs: number;
  requestTimeoutMs: number;
  zkTickMs: number;
  log: (line: string) => void;
}

interface ProxySlot {
  port: number;
  pgwirePort: number;
  child: ChildProcess | null;
}

interface WriterSlot {
  name: string;
  incarnation: number;
  child: ChildProcess | null;
  /** One per ZooKeeper server: the writer's whole view of the ensemble. */
  zkLinks: TcpProxy[];
}

export class ChaosCluster implements NemesisTarget {
  readonly opts: ClusterOptions;
  readonly historyDir: string;
  readonly logDir: string;
  private pg: RunningPostgres | null = null;
  private pgPort = 0;
  /** Set at the first start; a restart keeps port and data, so it holds while Postgres is down. */
  private pgUrl: string | null = null;
  private zk: LocalZooKeeper | null = null;
  private readonly proxySlots: ProxySlot[] = [];
  private readonly writerSlots: WriterSlot[] = [];
  private readonly leaders = new Map<string, { slot: number; token: string }>();
  private readonly eventsFile: string;

  private constructor(opts: ClusterOptions) {
    this.opts = opts;
    this.historyDir = join(opts.dir, 'writers');
    this.logDir = join(opts.dir, 'logs');
    this.eventsFile = join(this.logDir, 'writer-events.log');
    mkdirSync(this.historyDir, { recursive: true });
    mkdirSync(this.logDir, { recursive: true });
  }

  /** Starts everything; on failure stops what did start and rethrows. */
  static async start(opts: ClusterOptions): Promise<ChaosCluster> {
    const c = new ChaosCluster(opts);
    try {
      // allSettled, not all: when one fails, the other must still be known to stop() (a ZooKeeper
      // ensemble left running is three JVMs nobody stops).
      const [pgStart, zkStart] = await Promise.allSettled([
        c.startPostgres(),
        LocalZooKeeper.start({ servers: 3, tickTimeMs: opts.zkTickMs, baseDir: join(opts.dir, 'zookeeper') }),
      ]);
      if (zkStart.status === 'fulfilled') c.zk = zkStart.value;
      if (pgStart.status === 'rejected') throw pgStart.reason;
      if (zkStart.status === 'rejected') throw zkStart.reason;
      const zk = zkStart.value;
      opts.log(`postgres ${c.databaseUrl}; zookeeper ${zk.connectString}`);
      for (let i = 0; i < opts.proxies; i++) c.proxySlots.push({ port: 0, pgwirePort: 0, child: null });
      // Picked ports outside the ephemeral range, kept across restarts (the writers hold the URLs).
      await Promise.all(
        c.proxySlots.map((p, i) =>
          startOnFreePorts(2, async ([port, pgwirePort]) => {
            Object.assign(p, { port, pgwirePort });
            await c.startProxy(i);
          }),
        ),
      );
      await c.grantClientWrites();
      opts.log(`proxies ${c.proxyUrls.join(', ')}, SQL endpoints ${c.pgwireUrls.join(', ')} (fence mode ${opts.fenceMode})`);
      for (let i = 0; i < opts.writers; i++) {
        const zkLinks = await Promise.all(zk.nodes.map((n) => TcpProxy.start({ targetPort: n.clientPort })));
        c.writerSlots.push({ name: `w${i + 1}`, incarnation: -1, child: null, zkLinks });
      }
      await Promise.all(c.writerSlots.map((_, i) => c.startWriter(i)));
      return c;
    } catch (err) {
      await c.stop();
      throw err;
    }
  }

  /** Also while a fault has Postgres down: a writer restarted meanwhile needs it for its SQL door. */
  get databaseUrl(): string {
    if (this.pgUrl === null) throw new Error('postgres has not started');
    return this.pgUrl;
  }

  get proxyUrls(): string[] {
    return this.proxySlots.map((p) => `http://127.0.0.1:${p.port}`);
  }

  /** The proxies' SQL endpoints, naming the proxies' database. */
  get pgwireUrls(): string[] {
    const db = new URL(this.databaseUrl).pathname;
    return this.proxySlots.map((p) => `postgres://127.0.0.1:${p.pgwirePort}${db}`);
  }

  doorOf(slot: number): Door {
    const doors = this.opts.doors ?? [];
    return doors.length === 0 ? 'http' : doors[slot % doors.length]!;
  }

  /** The open-mode client login (created by the proxies at start) may write the objects table. */
  private async grantClientWrites(): Promise<void> {
    const client = new pg.Client({ connectionString: this.databaseUrl });
    await client.connect();
    try {
      await client.query(grantObjectWrites(TX_DEFAULTS.clientRole)); // FENCEPOST_CLIENT_ROLE is unset for the proxies
    } finally {
      await client.end();
    }
  }

  /** Resolves when every fence key has a writer that advanced its fence. */
  async waitForLeaders(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.opts.fenceKeys.some((k) => !this.leaders.has(k))) {
      if (Date.now() > deadline)
        throw new Error(`no leader within ${timeoutMs} ms for ${this.opts.fenceKeys.filter((k) => !this.leaders.has(k)).join(', ')}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  // ---- NemesisTarget --------------------------------------------------------------------------

  leaderOf(fenceKey: string): number | null {
    return this.leaders.get(fenceKey)?.slot ?? null;
  }

  currentLeaders(): { fenceKey: string; slot: number }[] {
    return [...this.leaders].map(([fenceKey, v]) => ({ fenceKey, slot: v.slot }));
  }

  async pauseWriter(slot: number, midWrite: boolean): Promise<void> {
    const child = this.writer(slot).child;
    const pid = child?.pid;
    if (!child || pid === undefined) return;
    if (midWrite) {
      // The writer freezes itself between taking its token and sending (see writer.ts); if it is
      // not writing (not a leader), stop it where it is once its request has lapsed.
      child.kill('SIGUSR2');
      const deadline = Date.now() + PAUSE_REQUEST_MS + 200;
      while (Date.now() < deadline) {
        if (isStopped(pid)) return;
        await new Promise((r) => setTimeout(r, 5));
      }
    }
    child.kill('SIGSTOP');
  }

  resumeWriter(slot: number): void {
    this.writer(slot).child?.kill('SIGCONT');
  }

  async killWriter(slot: number): Promise<void> {
    const w = this.writer(slot);
    const child = w.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    child.kill('SIGKILL');
    await exited;
  }

  async startWriter(slot: number): Promise<void> {
    const w = this.writer(slot);
    w.incarnation++;
    const id = `${w.name}.${w.incarnation}`;
    const err = openSync(join(this.logDir, `${id}.log`), 'a');
    const child = spawn(
      process.execPath,
      [
        ...TOOLS,
        'chaos-writer',
        '--id',
        id,
        '--zk',
        w.zkLinks.map((l) => l.address).join(','),
        '--proxies',
        this.proxyUrls.join(','),
        '--fence-keys',
        this.opts.fenceKeys.join(','),
        '--election-root',
        this.opts.electionRoot,
        '--history',
        join(this.historyDir, `${id}.jsonl`),
        '--session-timeout-ms',
        String(this.opts.sessionTimeoutMs),
        '--interval-ms',
        String(this.opts.intervalMs),
        '--work-ms',
        String(this.opts.workMs),
        '--request-timeout-ms',
        String(this.opts.requestTimeoutMs),
        '--door',
        this.doorOf(slot),
        '--pgwire',
        this.pgwireUrls.join(','),
      ],
      { stdio: ['ignore', 'pipe', err], env: { ...process.env, FENCEPOST_LOG_LEVEL: 'warn' } },
    );
    closeSync(err);
    w.child = child;
    createInterface({ input: child.stdout! }).on('line', (line) => {
      let e: WriterEvent;
      try {
        e = JSON.parse(line) as WriterEvent;
      } catch {
        return;
      }
      this.onEvent(slot, e);
      if (e.event !== 'write-begin') appendFileSync(this.eventsFile, line + '\n');
    });
    child.once('exit', () => this.forgetLeaderships(slot));
  }

  partitionWriter(slot: number): void {
    for (const l of this.writer(slot).zkLinks) l.blackhole();
  }

  healWriter(slot: number): void {
    for (const l of this.writer(slot).zkLinks) l.forward();
  }

  async stopZooKeeper(server: number): Promise<void> {
    await this.zk?.stopNode(server);
  }

  async startZooKeeper(server: number): Promise<void> {
    await this.zk?.startNode(server);
  }

  async stopProxy(index: number, signal: NodeJS.Signals): Promise<void> {
    const p = this.proxySlots[index];
    const child = p?.child;
    if (!p || !child) return;
    p.child = null;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  }

  async startProxy(index: number): Promise<void> {
    const p = this.proxySlots[index];
    if (!p) throw new Error(`no proxy ${index}`);
    if (p.child) return;
    const logFile = join(this.logDir, `proxy-${index + 1}.log`);
    const logStart = existsSync(logFile) ? statSync(logFile).size : 0;
    const out = openSync(logFile, 'a');
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      DATABASE_URL: this.databaseUrl,
      PORT: String(p.port),
      FENCEPOST_PGWIRE_PORT: String(p.pgwirePort),
      HOST: '127.0.0.1',
      FENCEPOST_LOG_LEVEL: 'info', // the listening lines: this process, not another, holds the ports
      FENCEPOST_POOL_SIZE: '6',
      FENCEPOST_SHUTDOWN_TIMEOUT_MS: '2000',
    };
    for (const k of [
      'FENCEPOST_KEYS',
      'FENCEPOST_KEYS_FILE',
      'FENCEPOST_FORGERY_GUARD',
      'FENCEPOST_WRITE_LANES',
      'FENCEPOST_MAX_BATCH',
      'FENCEPOST_CLIENT_ROLE',
    ])
      delete env[k];
    // The product's own `fencepost serve`, or the harness's with a broken fence (the checker's self-test).
    const args = this.opts.fenceMode === 'strict' ? [BIN, 'serve'] : [...TOOLS, 'serve', '--fence-mode', this.opts.fenceMode];
    const child = spawn(process.execPath, args, { stdio: ['ignore', out, out], env });
    closeSync(out);
    p.child = child;
    const url = `http://127.0.0.1:${p.port}`;
    const output = () => readFileSync(logFile).subarray(logStart).toString();
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) {
        p.child = null;
        const taken = portTakenLine(output());
        if (taken !== null) throw new PortTakenError(`proxy ${index + 1}: ${taken}`);
        throw new Error(`proxy ${index + 1} exited during start (${child.exitCode ?? child.signalCode}); see ${logFile}`);
      }
      const ports = listeningPorts(output(), true);
      if (
        ports?.http === p.port &&
        ports.pgwire === p.pgwirePort &&
        (await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(1000) }).then(
          (r) => r.ok,
          () => false,
        ))
      )
        return;
      if (Date.now() > deadline) throw new Error(`proxy ${index + 1} not ready within 60 s`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** `crash`: immediate shutdown (no checkpoint), so the restart runs WAL recovery. */
  async stopPostgres(crash = false): Promise<void> {
    const pg = this.pg;
    this.pg = null;
    await (crash ? pg?.crash() : pg?.stop());
  }

  /** The first start picks a free port; a restart keeps it (the proxies' DATABASE_URL names it). */
  async startPostgres(): Promise<void> {
    if (this.pg) return;
    const log = join(this.logDir, 'postgres.log');
    const opts = {
      dataDir: join(this.opts.dir, 'postgres', 'data'),
      log: (line: string) => appendFileSync(log, line + '\n'),
      // Which backend (pid, role, application) logged a line, and lock waits past deadlock_timeout.
      postgresFlags: ['-c', 'log_line_prefix=%m [%p] %u %a ', '-c', 'log_lock_waits=on'],
    };
    this.pg = this.pgPort === 0 ? await startPostgres(opts) : await startEmbeddedPostgres({ ...opts, port: this.pgPort });
    this.pgPort = this.pg.port;
    this.pgUrl = this.pg.url;
  }

  // ---- shutdown -------------------------------------------------------------------------------

  /** Stops the writers gracefully (SIGTERM; SIGKILL after `graceMs`): their in-flight writes finish. */
  async stopWriters(graceMs = 5000): Promise<void> {
    for (const w of this.writerSlots) for (const l of w.zkLinks) l.forward();
    await Promise.all(
      this.writerSlots.map(async (w) => {
        const child = w.child;
        if (!child || child.exitCode !== null || child.signalCode !== null) return;
        const exited = new Promise<void>((r) => child.once('exit', () => r()));
        child.kill('SIGCONT');
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
        await exited;
        clearTimeout(timer);
      }),
    );
  }

  /** Stops everything that runs; safe to call at any point, and more than once. */
  async stop(): Promise<void> {
    const attempt = async (what: string, fn: () => Promise<unknown>) => {
      try {
        await fn();
      } catch (err) {
        this.opts.log(`stopping ${what} failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    };
    await attempt('writers', () => this.stopWriters(3000));
    await attempt('zookeeper links', () => Promise.all(this.writerSlots.flatMap((w) => w.zkLinks.map((l) => l.close()))));
    await attempt('proxies', () => Promise.all(this.proxySlots.map((_, i) => this.stopProxy(i, 'SIGTERM'))));
    await attempt('zookeeper', async () => {
      await this.zk?.stop({ keepData: true });
      this.zk = null;
    });
    await attempt('postgres', () => this.stopPostgres());
  }

  private writer(slot: number): WriterSlot {
    const w = this.writerSlots[slot];
    if (!w) throw new Error(`no writer slot ${slot}`);
    return w;
  }

  private onEvent(slot: number, e: WriterEvent): void {
    if (e.fenceKey !== undefined && e.token !== undefined) {
      const cur = this.leaders.get(e.fenceKey);
      if (e.event === 'ready') this.leaders.set(e.fenceKey, { slot, token: e.token });
      else if ((e.event === 'revoked' || e.event === 'stepped-down') && cur?.slot === slot && cur.token === e.token)
        this.leaders.delete(e.fenceKey);
    }
  }

  /** A dead writer leads nothing (its restart is a new candidate with new tokens). */
  private forgetLeaderships(slot: number): void {
    for (const [k, v] of [...this.leaders]) if (v.slot === slot) this.leaders.delete(k);
  }
}

/** Linux: is the process stopped (state T in /proc/<pid>/stat)? */
function isStopped(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) === 'T';
  } catch {
    return false;
  }
}
