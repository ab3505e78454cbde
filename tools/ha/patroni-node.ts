// One Patroni node on loopback: Debian's `patroni` running Debian's Postgres 15 from the config of
// tools/ha/patroni.yml, with its own ports and folder. As root, Patroni (and so Postgres) runs as
// the `postgres` OS user, which owns the node's folder. Patroni starts its postmaster in a session
// of its own (os.setsid), so a crash of the node kills two process groups: Patroni's and the
// postmaster's.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { chownSync, createWriteStream, existsSync, mkdirSync, readFileSync, writeFileSync, type WriteStream } from 'node:fs';
import { userInfo } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fillTemplate } from './template.ts';

export const PATRONI_TEMPLATE = join(import.meta.dirname, 'patroni.yml');

export interface PatroniNodeSpec {
  name: string;
  pgPort: number;
  restPort: number;
  /** The node's folder: config, pgpass, Unix socket, log; the data dir below it. */
  dir: string;
  zkConnect: string;
  superuserPassword: string;
  replicationPassword: string;
}

/** A member as Patroni's GET /cluster lists it. */
export interface ClusterMember {
  name: string;
  role: 'leader' | 'sync_standby' | 'replica' | 'standby_leader' | string;
  state: string;
  host: string;
  port: number;
  timeline?: number;
  lag?: number | string;
}

/** The uid and gid Postgres must run as when this process is root; null otherwise. */
export function postgresUser(): { uid: number; gid: number } | null {
  if (userInfo().uid !== 0) return null;
  return { uid: Number(execFileSync('id', ['-u', 'postgres']).toString()), gid: Number(execFileSync('id', ['-g', 'postgres']).toString()) };
}

export class PatroniNode {
  readonly spec: PatroniNodeSpec;
  readonly dataDir: string;
  readonly configPath: string;
  private child: ChildProcess | null = null;
  private readonly logStream: WriteStream;

  constructor(spec: PatroniNodeSpec) {
    this.spec = spec;
    this.dataDir = join(spec.dir, 'data');
    this.configPath = join(spec.dir, 'patroni.yml');
    mkdirSync(spec.dir, { recursive: true, mode: 0o700 });
    writeFileSync(
      this.configPath,
      fillTemplate(readFileSync(PATRONI_TEMPLATE, 'utf8'), {
        NAME: spec.name,
        REST_PORT: spec.restPort,
        PG_PORT: spec.pgPort,
        ZK_CONNECT: spec.zkConnect,
        DATA_DIR: this.dataDir,
        NODE_DIR: spec.dir,
        SUPERUSER_PASSWORD: spec.superuserPassword,
        REPLICATION_PASSWORD: spec.replicationPassword,
      }),
    );
    const ids = postgresUser();
    if (ids) {
      chownSync(spec.dir, ids.uid, ids.gid);
      chownSync(this.configPath, ids.uid, ids.gid);
    }
    this.logStream = createWriteStream(join(spec.dir, '..', `${spec.name}.log`), { flags: 'a' });
  }

  get name(): string {
    return this.spec.name;
  }

  get running(): boolean {
    return this.child !== null && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Starts Patroni (it bootstraps, clones or rejoins on its own). */
  start(): void {
    if (this.running) return;
    const ids = postgresUser();
    const child = spawn('patroni', [this.configPath], {
      ...(ids ?? {}),
      cwd: this.spec.dir,
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: this.spec.dir, LANG: 'C.UTF-8', LC_ALL: 'C.UTF-8' },
      // A process group of its own, so that a crash can take all of it.
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout?.pipe(this.logStream, { end: false });
    child.stderr?.pipe(this.logStream, { end: false });
    this.child = child;
  }

  /** The postmaster's pid from its pid file, when that process still lives. */
  postmasterPid(): number | null {
    const pidFile = join(this.dataDir, 'postmaster.pid');
    if (!existsSync(pidFile)) return null;
    const pid = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
    if (!Number.isInteger(pid) || pid <= 0) return null;
    try {
      process.kill(pid, 0);
      return pid;
    } catch {
      return null;
    }
  }

  /**
   * A crash of the whole node: Patroni's process group, the postmaster and every Postgres process
   * it forked (each backend runs in a session of its own), frozen with SIGSTOP so that none can
   * fork or react, then SIGKILLed. Resolves once they are gone.
   */
  async crash(): Promise<void> {
    const child = this.child;
    const patroniGroup = child?.pid !== undefined && this.running ? child.pid : null;
    if (patroniGroup !== null) killGroup(patroniGroup, 'SIGSTOP');
    const postgres = this.postgresTree('SIGSTOP');
    if (patroniGroup !== null) killGroup(patroniGroup, 'SIGKILL');
    for (const pid of postgres) signal(pid, 'SIGKILL');
    if (child && child.exitCode === null && child.signalCode === null) await new Promise((r) => child.once('exit', r));
    this.child = null;
    for (let i = 0; i < 200 && postgres.some(alive); i++) await sleep(50);
  }

  /** The postmaster and its children, each sent `sig` (the postmaster first); [] when it is not running. */
  private postgresTree(sig: NodeJS.Signals): number[] {
    const pm = this.postmasterPid();
    if (pm === null) return [];
    signal(pm, sig);
    return [pm, ...childrenOf(pm)];
  }

  /** Stops Patroni as an operator would (SIGTERM: it stops Postgres first), then kills what is left. */
  async stop(timeoutMs = 15_000): Promise<void> {
    const child = this.child;
    if (child?.pid !== undefined && this.running) {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const timedOut = await Promise.race([exited.then(() => false), sleep(timeoutMs).then(() => true)]);
      if (timedOut) killGroup(child.pid, 'SIGKILL');
    }
    this.child = null;
    // Whatever Postgres left running (Patroni killed before it stopped Postgres) dies now.
    for (const pid of this.postgresTree('SIGSTOP')) signal(pid, 'SIGKILL');
    child?.stdout?.destroy();
    child?.stderr?.destroy();
  }

  /** Patroni's REST API: status and body (JSON when it parses), or null when it does not answer. */
  async rest(method: string, path: string, body?: unknown, timeoutMs = 3000): Promise<{ status: number; json: unknown } | null> {
    try {
      const res = await fetch(`http://127.0.0.1:${this.spec.restPort}${path}`, {
        method,
        signal: AbortSignal.timeout(timeoutMs),
        ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } }),
      });
      const text = await res.text();
      let json: unknown = text;
      try {
        json = JSON.parse(text);
      } catch {
        // plain text answers (switchover)
      }
      return { status: res.status, json };
    } catch {
      return null;
    }
  }

  /** The cluster as this node sees it in ZooKeeper (GET /cluster), or null. */
  async members(): Promise<ClusterMember[] | null> {
    const r = await this.rest('GET', '/cluster');
    if (!r || r.status !== 200) return null;
    return ((r.json as { members?: ClusterMember[] }).members ?? []) as ClusterMember[];
  }

  closeLog(): void {
    this.logStream.end();
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function childrenOf(pid: number): number[] {
  try {
    return execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)])
      .toString()
      .split('\n')
      .map(Number)
      .filter((p) => Number.isInteger(p) && p > 0);
  } catch {
    return []; // ps exits 1 when there are none
  }
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

function killGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // already gone
  }
}
