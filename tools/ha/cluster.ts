// The tested HA deployment, all on loopback: one ZooKeeper, three Patroni nodes (Postgres 15,
// synchronous_mode_strict), HAProxy in front of whichever is primary, and one `fencepost serve`
// whose DATABASE_URL is HAProxy. Every process is the run's own; stop() ends them all.
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, createWriteStream } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { LocalZooKeeper } from '../../src/demo/local-zookeeper.ts';
import { freePort, startOnFreePort } from '../../src/ports.ts';
import { listeningPorts } from '../serve-listening.ts';
import { HaProxy } from './haproxy.ts';
import { PatroniNode } from './patroni-node.ts';

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'fencepost.js');

export interface HaClusterOptions {
  /** Run folder (logs, data); must be traversable by the postgres user. */
  dir: string;
  log: (line: string) => void;
}

export class HaCluster {
  readonly nodes: PatroniNode[] = [];
  readonly dir: string;
  readonly superuserPassword = randomBytes(12).toString('hex');
  zk: LocalZooKeeper | null = null;
  haproxy: HaProxy | null = null;
  proxyUrl = '';
  private proxy: ChildProcess | null = null;
  private readonly log: (line: string) => void;

  constructor(opts: HaClusterOptions) {
    this.dir = opts.dir;
    this.log = opts.log;
  }

  /** postgresql://… of one node, or of HAProxy (`port` its listener). */
  url(port: number): string {
    return `postgresql://postgres:${this.superuserPassword}@127.0.0.1:${port}/postgres`;
  }

  get databaseUrl(): string {
    if (!this.haproxy) throw new Error('HAProxy is not running');
    return this.url(this.haproxy.port);
  }

  async start(): Promise<void> {
    chmodSync(this.dir, 0o755);
    this.zk = await LocalZooKeeper.start({ baseDir: join(this.dir, 'zookeeper'), tickTimeMs: 500 });
    this.log(`ZooKeeper at ${this.zk.connectString}`);
    const replicationPassword = randomBytes(12).toString('hex');
    // Patroni's ports are picked and not retried: a Postgres that cannot bind is started again and
    // again by Patroni, which does not exit. Outside the ephemeral range, only another picked port
    // can take one; the run then fails waiting for the node.
    for (let i = 1; i <= 3; i++) {
      this.nodes.push(
        new PatroniNode({
          name: `node${i}`,
          pgPort: await freePort(),
          restPort: await freePort(),
          dir: join(this.dir, `node${i}`),
          zkConnect: this.zk.connectString,
          superuserPassword: this.superuserPassword,
          replicationPassword,
        }),
      );
    }
    // node1 bootstraps alone (initdb); the others then clone it with pg_basebackup.
    this.nodes[0]!.start();
    await this.waitFor('node1 to bootstrap and lead', 90_000, async () => (await this.leader())?.name === 'node1');
    for (const n of this.nodes.slice(1)) n.start();
    await this.waitHealthy({ sync: true, timeoutMs: 120_000 });
    this.haproxy = await startOnFreePort((port) =>
      HaProxy.start(
        this.dir,
        port,
        this.nodes.map((n) => n.spec),
      ),
    );
    // HAProxy takes every server for up until its checks say otherwise (2 s here): until then it
    // sends connections round robin to standbys too. Six connections in a row on the primary: the
    // standbys are marked down.
    await this.waitFor('HAProxy to reach the primary only', 30_000, async () => {
      for (let i = 0; i < 6; i++) {
        if ((await this.queryVia(this.haproxy!.port, 'SELECT NOT pg_is_in_recovery() AS primary').catch(() => null))?.[0]?.primary !== true)
          return false;
      }
      return true;
    });
    this.log(`HAProxy at 127.0.0.1:${this.haproxy.port}`);
    await this.startProxy();
    const ready = (await (await fetch(`${this.proxyUrl}/readyz`)).json()) as { durability?: { warnings?: string[] } };
    const warnings = ready.durability?.warnings ?? [];
    this.log(
      `fencepost proxy at ${this.proxyUrl} (DATABASE_URL at HAProxy); durability warnings in /readyz: ${warnings.length === 0 ? 'none' : warnings.join(' | ')}`,
    );
  }

  /** On a free port (PORT=0: of FENCEPOST_PORT_RANGE when set), which its listening line names. */
  private async startProxy(): Promise<void> {
    const logFile = createWriteStream(join(this.dir, 'fencepost.log'));
    const child = spawn(process.execPath, [BIN, 'serve'], {
      env: { ...process.env, DATABASE_URL: this.databaseUrl, PORT: '0', HOST: '127.0.0.1', FENCEPOST_LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    const keep = (d: Buffer) => (output += d.toString());
    child.stdout?.pipe(logFile);
    child.stderr?.pipe(logFile);
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    this.proxy = child;
    await this.waitFor('the fencepost proxy to be ready', 60_000, async () => {
      if (child.exitCode !== null)
        throw new Error(`fencepost serve exited with ${child.exitCode} (see ${join(this.dir, 'fencepost.log')})`);
      const ports = listeningPorts(output, false);
      if (ports === null) return false;
      this.proxyUrl = `http://127.0.0.1:${ports.http}`;
      return await fetch(`${this.proxyUrl}/readyz`, { signal: AbortSignal.timeout(2000) }).then(
        (r) => r.ok,
        () => false,
      );
    });
    child.stdout?.off('data', keep);
    child.stderr?.off('data', keep);
  }

  /** The node whose REST API answers 200 to GET /primary (as HAProxy checks), or null. */
  async leader(): Promise<PatroniNode | null> {
    for (const n of this.nodes) {
      if (!n.running) continue;
      const r = await n.rest('GET', '/primary', undefined, 1500);
      if (r?.status === 200) return n;
    }
    return null;
  }

  node(name: string): PatroniNode {
    const n = this.nodes.find((x) => x.name === name);
    if (!n) throw new Error(`no node ${name}`);
    return n;
  }

  /** Runs one query on a node's Postgres (or HAProxy's port) as the superuser. */
  async queryVia<T extends pg.QueryResultRow>(port: number, text: string, values: unknown[] = []): Promise<T[]> {
    const client = new pg.Client({ connectionString: this.url(port), connectionTimeoutMillis: 3000, query_timeout: 5000 });
    client.on('error', () => {});
    await client.connect();
    try {
      return (await client.query<T>(text, values)).rows;
    } finally {
      await client.end().catch(() => {});
    }
  }

  /**
   * Every node up, one primary, and each other node streaming from it; with `sync`, each of them a
   * synchronous standby (tools/ha/patroni.yml's synchronous_node_count).
   */
  async waitHealthy(opts: { sync: boolean; timeoutMs: number }): Promise<PatroniNode> {
    let primary: PatroniNode | null = null;
    await this.waitFor(`all three nodes streaming${opts.sync ? ', each synchronously' : ''}`, opts.timeoutMs, async () => {
      primary = await this.leader();
      if (!primary) return false;
      const rows = await this.queryVia<{ application_name: string; sync_state: string }>(
        primary.spec.pgPort,
        `SELECT application_name, sync_state FROM pg_stat_replication WHERE state = 'streaming'`,
      ).catch(() => []);
      if (rows.length < this.nodes.length - 1) return false;
      if (!opts.sync) return true;
      if (!rows.every((r) => r.sync_state === 'sync')) return false;
      // Patroni's own record (the sync key in ZooKeeper, which decides who may be promoted):
      // GET /sync answers 200 on a synchronous standby.
      const standbys = this.nodes.filter((n) => n !== primary);
      const answers = await Promise.all(standbys.map((n) => n.rest('GET', '/sync', undefined, 1500)));
      return answers.every((a) => a?.status === 200);
    });
    return primary!;
  }

  /** Nodes that are neither the primary nor streaming from it (all but the primary when there is none). */
  async notStreaming(): Promise<PatroniNode[]> {
    const primary = await this.leader();
    if (!primary) return this.nodes.slice();
    const rows = await this.queryVia<{ application_name: string }>(
      primary.spec.pgPort,
      `SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'`,
    ).catch(() => []);
    const streaming = new Set(rows.map((r) => r.application_name));
    return this.nodes.filter((n) => n !== primary && !streaming.has(n.name));
  }

  /** The synchronous standbys' names, as the primary reports them. */
  async syncStandbys(primary: PatroniNode): Promise<string[]> {
    const rows = await this.queryVia<{ application_name: string }>(
      primary.spec.pgPort,
      `SELECT application_name FROM pg_stat_replication WHERE sync_state = 'sync' ORDER BY 1`,
    );
    return rows.map((r) => r.application_name);
  }

  /** Changes the cluster's dynamic configuration (Patroni's PATCH /config). */
  async patchConfig(change: Record<string, unknown>): Promise<void> {
    const primary = await this.leader();
    if (!primary) throw new Error('no primary to PATCH /config on');
    const r = await primary.rest('PATCH', '/config', change);
    if (r?.status !== 200) throw new Error(`PATCH /config answered ${r?.status ?? 'nothing'}: ${JSON.stringify(r?.json)}`);
  }

  async waitFor(what: string, timeoutMs: number, cond: () => Promise<boolean>): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (await cond()) return;
      if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (logs in ${this.dir})`);
      await sleep(250);
    }
  }

  /** Ends every process of the run; safe to call twice and after a failed start. */
  async stop(): Promise<void> {
    const proxy = this.proxy;
    if (proxy && proxy.exitCode === null && proxy.signalCode === null) {
      const exited = new Promise((r) => proxy.once('exit', r));
      proxy.kill('SIGTERM');
      const timer = setTimeout(() => proxy.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    }
    await this.haproxy?.stop().catch(() => {});
    await Promise.all(this.nodes.map((n) => n.stop(10_000).catch(() => {})));
    for (const n of this.nodes) n.closeLog();
    await this.zk?.stop({ keepData: true }).catch(() => {});
  }
}
