// A real primary with a real streaming standby, from the embedded Postgres binaries (which have no
// pg_basebackup: the standby's data dir is a copy of the primary's, taken while it is stopped).
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { appendFileSync, chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { startEmbeddedPostgres, type RunningPostgres } from '../../src/fence/embedded-postgres.ts';
import { freePort } from '../../tools/zookeeper/local-server.ts';

export interface ReplicatedPostgres {
  /** The primary's admin URL (superuser). */
  url: string;
  /** The same on the standby (read-only, in recovery). */
  standbyUrl: string;
  standbyName: string;
  /** SIGSTOPs the standby's walreceiver: it stays connected (pg_stat_replication: streaming) but confirms nothing. */
  pauseStandby(): Promise<void>;
  /** SIGCONTs what pauseStandby stopped. */
  resumeStandby(): Promise<void>;
  /** Stops the standby (fast shutdown): no standby streams. */
  stopStandby(): Promise<void>;
  /** Starts the standby again and waits until it streams. */
  startStandby(): Promise<void>;
  stop(): Promise<void>;
}

/** As root, Postgres runs as the `postgres` user (startEmbeddedPostgres creates it). */
function postgresIds(): { uid: number; gid: number } | Record<string, never> {
  if (userInfo().uid !== 0) return {};
  return { uid: Number(execFileSync('id', ['-u', 'postgres']).toString()), gid: Number(execFileSync('id', ['-g', 'postgres']).toString()) };
}

async function postgresBinary(): Promise<string> {
  const mod = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as { postgres: string };
  return mod.postgres;
}

/** Starts a primary and one standby streaming from it (asynchronous until synchronous_standby_names names it). */
export async function startReplicatedPostgres(standbyName: string): Promise<ReplicatedPostgres> {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-repl-'));
  chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
  const primaryDir = join(dir, 'primary');
  const standbyDir = join(dir, 'standby');
  const port = await freePort();
  let primary: RunningPostgres | undefined;
  let standby: ChildProcess | undefined;
  let paused: number | null = null;
  let output = '';
  let url = '';
  let standbyPort = 0;
  const stopStandby = async () => {
    if (paused !== null) process.kill(paused, 'SIGCONT');
    paused = null;
    if (standby && standby.exitCode === null) {
      const exited = new Promise((r) => standby!.once('exit', r));
      standby.kill('SIGINT'); // fast shutdown
      await exited;
    }
  };
  const stop = async () => {
    await stopStandby();
    await primary?.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  const startStandby = async () => {
    output = '';
    const child = spawn(await postgresBinary(), ['-D', standbyDir, '-p', String(standbyPort), '-c', 'listen_addresses=127.0.0.1', '-c', 'fsync=off'], { ...postgresIds(), stdio: ['ignore', 'ignore', 'pipe'] });
    standby = child;
    child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      for (let i = 0; ; i++) {
        const { rows } = await client.query(`SELECT 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, [standbyName]);
        if (rows.length > 0) break;
        if (child.exitCode !== null || i > 300) throw new Error(`standby did not start streaming:\n${output}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      await client.end();
    }
  };
  try {
    primary = await startEmbeddedPostgres({ dataDir: primaryDir, port, postgresFlags: ['-c', 'fsync=off'] });
    url = primary.url;
    await primary.stop();
    // A clean shutdown leaves a consistent data dir: its copy is a base backup. cp -a keeps the owner.
    execFileSync('cp', ['-a', primaryDir, standbyDir]);
    const { username, password } = new URL(url);
    writeFileSync(join(standbyDir, 'standby.signal'), '');
    appendFileSync(join(standbyDir, 'postgresql.auto.conf'), `primary_conninfo = 'host=127.0.0.1 port=${port} user=${username} password=${password} application_name=${standbyName}'\n`);
    primary = await startEmbeddedPostgres({ dataDir: primaryDir, port, postgresFlags: ['-c', 'fsync=off'] });
    standbyPort = await freePort();
    await startStandby();
    const standbyUrl = new URL(url);
    standbyUrl.port = String(standbyPort);
    const pauseStandby = async () => {
      const c = new pg.Client({ connectionString: standbyUrl.toString() });
      await c.connect();
      try {
        const { rows } = await c.query<{ pid: number }>('SELECT pid FROM pg_stat_wal_receiver');
        if (rows[0] === undefined) throw new Error('the standby has no walreceiver');
        paused = rows[0].pid;
        process.kill(paused, 'SIGSTOP');
      } finally {
        await c.end();
      }
    };
    const resumeStandby = async () => {
      if (paused !== null) process.kill(paused, 'SIGCONT');
      paused = null;
    };
    return { url, standbyUrl: standbyUrl.toString(), standbyName, pauseStandby, resumeStandby, stopStandby, startStandby, stop };
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
}
