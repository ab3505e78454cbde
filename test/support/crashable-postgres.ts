// A Postgres of a test file's own that the test may crash: SIGKILL to the postmaster and every one
// of its processes at once (no shutdown, no checkpoint, no WAL flush), then a start on the same
// data dir, which runs WAL recovery. What survives is what had reached the kernel before the kill:
// a commit acknowledged with synchronous_commit on, never one whose WAL still sat in Postgres's
// buffers. The shared run's Postgres (global-setup.ts) is never crashed.
import { chmodSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startEmbeddedPostgres, type RunningPostgres } from '../../src/fence/embedded-postgres.ts';
import { startPostgres } from '../../tools/postgres.ts';

export interface CrashablePostgres {
  /** The admin URL (database `postgres`); `withDatabase` (db.ts) points it elsewhere. */
  readonly url: string;
  /** SIGKILL to the postmaster and all its children; resolves once none is left. */
  kill(): Promise<void>;
  /** Starts Postgres again on the same data dir and port (WAL recovery after a kill). */
  restart(): Promise<void>;
  /** Stops it (if running) and removes its data dir. */
  destroy(): Promise<void>;
}

export async function startCrashablePostgres(postgresFlags: string[]): Promise<CrashablePostgres> {
  // Under the OS temp dir and traversable: as root, Postgres runs as the postgres user.
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-crash-pg-'));
  chmodSync(dir, 0o755);
  const dataDir = join(dir, 'data');
  let pg: RunningPostgres | null = await startPostgres({ dataDir, postgresFlags });
  const { url, port } = pg;
  // A restart keeps the port (the test holds the URL). It lies outside the ephemeral range: only
  // another server's picked port could take it while Postgres is down, and the start then fails.
  const start = () => startEmbeddedPostgres({ dataDir, port, postgresFlags });
  return {
    url,
    kill: async () => {
      const postmaster = postmasterPid(dataDir);
      if (postmaster === null) throw new Error(`no postmaster running on ${dataDir}`);
      // Stopped first, so it cannot react to its children's deaths (reset them, write a checkpoint).
      process.kill(postmaster, 'SIGSTOP');
      const all = [postmaster, ...childrenOf(postmaster)];
      for (const pid of all) signal(pid, 'SIGKILL');
      // The postmaster is this process's child: gone once node has reaped it (a zombie's pid still
      // answers kill 0, and the next start would take it for a running server).
      const left = () => all.filter((pid) => (pid === postmaster ? existsSync(`/proc/${pid}`) : alive(pid)));
      for (let i = 0; i < 400 && left().length > 0; i++) await sleep(25);
      if (left().length > 0) throw new Error(`Postgres processes ${left().join(', ')} survived SIGKILL`);
      pg = null;
    },
    restart: async () => {
      pg = await start();
    },
    destroy: async () => {
      await pg?.stop().catch(() => {});
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function postmasterPid(dataDir: string): number | null {
  const file = join(dataDir, 'postmaster.pid');
  if (!existsSync(file)) return null;
  const pid = Number(readFileSync(file, 'utf8').split('\n')[0]);
  return Number.isInteger(pid) && pid > 0 && alive(pid) ? pid : null;
}

/** The pid's direct children, from /proc (every Postgres process is forked by the postmaster). */
function childrenOf(parent: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(entry)) continue;
    try {
      // Fields after the command (in parentheses, which may hold spaces): state, ppid, …
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === parent) children.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return children;
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

/** Running, and not a zombie waiting to be reaped. */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}
