// A real primary with a real streaming standby, from the embedded Postgres binaries (which have no
// pg_basebackup: the standby's data dir is a copy of the primary's, taken while it is stopped).
import { execFileSync, type ChildProcess } from 'node:child_process';
import { appendFileSync, chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import type { RunningPostgres } from '../../src/fence/embedded-postgres.ts';
import { startOnFreePort } from '../../src/ports.ts';
import { runPostgres, startPostgres } from '../../tools/postgres.ts';
import { migrate } from '../../src/fence/migrate.ts';
import { withDatabase, type TestDatabase } from './db.ts';

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

/** Starts a primary and one standby streaming from it (asynchronous until synchronous_standby_names names it). */
export async function startReplicatedPostgres(standbyName: string): Promise<ReplicatedPostgres> {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-repl-'));
  chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
  const primaryDir = join(dir, 'primary');
  const standbyDir = join(dir, 'standby');
  let primary: RunningPostgres | undefined;
  let standby: ChildProcess | undefined;
  let paused: StalledStandby | null = null;
  let url = '';
  let standbyPort = 0;
  const stopStandby = async () => {
    paused?.resume();
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
  // Again after stopStandby on the same port (standbyUrl names it): outside the ephemeral range, only
  // another picked port can take it meanwhile.
  const startStandby = async (port = standbyPort) => {
    const started = await runPostgres(standbyDir, port, ['-c', 'fsync=off']);
    const child = started.child;
    standby = child;
    standbyPort = port;
    const output = started.output;
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      for (let i = 0; ; i++) {
        const { rows } = await client.query(`SELECT 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, [
          standbyName,
        ]);
        if (rows.length > 0) break;
        if (child.exitCode !== null || i > 300) throw new Error(`standby did not start streaming:\n${output()}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      await client.end();
    }
  };
  try {
    primary = await startPostgres({ dataDir: primaryDir, postgresFlags: ['-c', 'fsync=off'] });
    await primary.stop();
    // A clean shutdown leaves a consistent data dir: its copy is a base backup. cp -a keeps the owner.
    execFileSync('cp', ['-a', primaryDir, standbyDir]);
    primary = await startPostgres({ dataDir: primaryDir, postgresFlags: ['-c', 'fsync=off'] });
    url = primary.url;
    const { username, password } = new URL(url);
    writeFileSync(join(standbyDir, 'standby.signal'), '');
    appendFileSync(
      join(standbyDir, 'postgresql.auto.conf'),
      `primary_conninfo = 'host=127.0.0.1 port=${primary.port} user=${username} password=${password} application_name=${standbyName}'\n`,
    );
    await startOnFreePort((port) => startStandby(port));
    const standbyUrl = new URL(url);
    standbyUrl.port = String(standbyPort);
    const pauseStandby = async () => {
      paused = await stallStandby({ standbyUrl: standbyUrl.toString() });
    };
    const resumeStandby = async () => {
      paused?.resume();
      paused = null;
    };
    return {
      url,
      standbyUrl: standbyUrl.toString(),
      standbyName,
      pauseStandby,
      resumeStandby,
      stopStandby,
      startStandby: () => startStandby(),
      stop,
    };
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
}

/**
 * Makes the standby synchronous (synchronous_standby_names names it): from now on every commit on
 * the primary waits until the standby has flushed its WAL. Resolves once the primary reports it
 * `sync`.
 */
export async function makeStandbySynchronous(repl: ReplicatedPostgres): Promise<void> {
  await setSynchronousStandbyNames(repl, `"${repl.standbyName}"`, 'sync');
}

/** Sets synchronous_standby_names on the primary and waits until the standby's sync_state is `state`. */
export async function setSynchronousStandbyNames(repl: ReplicatedPostgres, names: string, state: string): Promise<void> {
  const client = new pg.Client({ connectionString: repl.url });
  await client.connect();
  try {
    await client.query(`ALTER SYSTEM SET synchronous_standby_names = ${pg.escapeLiteral(names)}`);
    await client.query('SELECT pg_reload_conf()');
    for (let i = 0; ; i++) {
      const { rows } = await client.query<{ sync_state: string }>(
        'SELECT sync_state FROM pg_stat_replication WHERE application_name = $1',
        [repl.standbyName],
      );
      if (rows[0]?.sync_state === state) return;
      if (i > 300) throw new Error(`the standby's sync_state stayed ${rows[0]?.sync_state}, expected ${state}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    await client.end();
  }
}

export interface StalledStandby {
  /** The walreceiver's pid on the standby (stopped with SIGSTOP). */
  pid: number;
  /** SIGCONT: the standby flushes again, and the commits waiting for it complete. */
  resume(): void;
}

/**
 * Stalls the standby's WAL receiver (SIGSTOP): a synchronous standby then never confirms, so every
 * commit on the primary waits in SyncRep until resume(). Resume well within wal_sender_timeout
 * (60 s), or the primary drops the replication connection.
 */
export async function stallStandby(repl: Pick<ReplicatedPostgres, 'standbyUrl'>): Promise<StalledStandby> {
  const client = new pg.Client({ connectionString: repl.standbyUrl });
  await client.connect();
  let pid: number;
  try {
    for (let i = 0; ; i++) {
      const { rows } = await client.query<{ pid: number }>(`SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'`);
      if (rows[0] !== undefined) {
        pid = rows[0].pid;
        break;
      }
      if (i > 300) throw new Error('the standby has no streaming WAL receiver');
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    await client.end();
  }
  process.kill(pid, 'SIGSTOP');
  let resumed = false;
  return {
    pid,
    resume: () => {
      if (resumed) return;
      resumed = true;
      process.kill(pid, 'SIGCONT');
    },
  };
}

/**
 * A primary with a synchronous standby (`makeStandbySynchronous`) and a migrated database
 * `database` on it, with a table `public.items (id int PRIMARY KEY, v text)` for the writers'
 * rows; its pool is the owner's. Stopped with the pair (`repl.stop()`).
 */
export async function startSynchronousDatabase(
  standbyName: string,
  database: string,
): Promise<{ repl: ReplicatedPostgres; db: TestDatabase }> {
  const repl = await startReplicatedPostgres(standbyName);
  const admin = new pg.Client({ connectionString: repl.url });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${pg.escapeIdentifier(database)}`);
  await admin.end();
  const url = withDatabase(repl.url, database);
  const pool = new pg.Pool({ connectionString: url, max: 4 });
  pool.on('error', () => {});
  await migrate(pool);
  await pool.query('CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  await makeStandbySynchronous(repl);
  return { repl, db: { url, pool, drop: async () => {} } };
}

/** Waits until no commit on the primary waits for the synchronous standby (after it resumed). */
export async function drainSyncRep(pool: pg.Pool): Promise<void> {
  for (let i = 0; (await pool.query(`SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'`)).rows.length > 0; i++) {
    if (i > 400) throw new Error('commits still wait for the standby after it resumed');
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Backend pids on the primary waiting for the synchronous standby (wait_event SyncRep), polled until at least `n` or `timeoutMs`. */
export async function syncRepWaiters(url: string, n = 1, timeoutMs = 20_000): Promise<number[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const { rows } = await client.query<{ pid: number }>(
        `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' ORDER BY backend_start`,
      );
      if (rows.length >= n) return rows.map((r) => r.pid);
      if (Date.now() > until)
        throw new Error(`${rows.length} backends wait on the synchronous standby after ${timeoutMs} ms, expected ${n}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    await client.end();
  }
}

export interface FailoverPair {
  /** The primary's admin URL (superuser); after promoteStandby, still the old primary's. */
  primaryUrl: string;
  /** The standby's admin URL; after promoteStandby, the new primary's. */
  standbyUrl: string;
  primaryPort: number;
  standbyPort: number;
  /** Fast shutdown of the primary (SIGINT): its sessions end with 57P01, later connections are refused. */
  stopPrimary(): Promise<void>;
  /** pg_promote() on the standby; resolves once it takes writes. */
  promoteStandby(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * A primary and a streaming standby that a test can fail over: both run as child processes of
 * this one, so either can be stopped alone (embedded-postgres's stop waits forever for a server
 * stopped by someone else).
 */
export async function startFailoverPair(standbyName: string): Promise<FailoverPair> {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-failover-'));
  chmodSync(dir, 0o755);
  const primaryDir = join(dir, 'primary');
  const standbyDir = join(dir, 'standby');
  const children: ChildProcess[] = [];
  const outputs: (() => string)[] = [];
  const run = async (dataDir: string, port: number) => {
    const started = await runPostgres(dataDir, port, ['-c', 'fsync=off']);
    children.push(started.child);
    outputs.push(started.output);
    return started;
  };
  const output = () => outputs.map((o) => o()).join('');
  const halt = async (child: ChildProcess | undefined) => {
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGINT');
    await exited;
  };
  const stop = async () => {
    for (const c of children) await halt(c);
    rmSync(dir, { recursive: true, force: true });
  };
  const waitFor = async (url: string, ok: (c: pg.Client) => Promise<boolean>, what: string) => {
    for (let i = 0; ; i++) {
      const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
      c.on('error', () => {});
      const done = await c
        .connect()
        .then(
          () => ok(c),
          () => false,
        )
        .finally(() => c.end().catch(() => {}));
      if (done) return;
      if (i > 300) throw new Error(`${what}:\n${output()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  try {
    const init = await startPostgres({ dataDir: primaryDir, postgresFlags: ['-c', 'fsync=off'] });
    await init.stop();
    execFileSync('cp', ['-a', primaryDir, standbyDir]);
    const primary = await startOnFreePort((port) => run(primaryDir, port));
    const primaryPort = primary.port;
    const primaryAt = new URL(init.url);
    primaryAt.port = String(primaryPort);
    const primaryUrl = primaryAt.toString();
    const { username, password } = primaryAt;
    writeFileSync(join(standbyDir, 'standby.signal'), '');
    appendFileSync(
      join(standbyDir, 'postgresql.auto.conf'),
      `primary_conninfo = 'host=127.0.0.1 port=${primaryPort} user=${username} password=${password} application_name=${standbyName}'\n`,
    );
    const standbyPort = (await startOnFreePort((port) => run(standbyDir, port))).port;
    const standbyUrl = new URL(primaryUrl);
    standbyUrl.port = String(standbyPort);
    await waitFor(
      primaryUrl,
      async (c) =>
        (await c.query(`SELECT 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, [standbyName])).rows
          .length > 0,
      'the standby did not start streaming',
    );
    return {
      primaryUrl,
      standbyUrl: standbyUrl.toString(),
      primaryPort,
      standbyPort,
      stopPrimary: () => halt(primary.child),
      promoteStandby: async () => {
        await waitFor(
          standbyUrl.toString(),
          async (c) => (await c.query<{ p: boolean }>('SELECT pg_promote(true, 60) AS p')).rows[0]!.p,
          'the standby was not promoted',
        );
        await waitFor(
          standbyUrl.toString(),
          async (c) => !(await c.query<{ r: boolean }>('SELECT pg_is_in_recovery() AS r')).rows[0]!.r,
          'the promoted standby stayed in recovery',
        );
      },
      stop,
    };
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
}
