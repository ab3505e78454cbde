// Throw-away Postgres servers (the embedded binaries) for tests, the demo, chaos runs and benches,
// on ports picked outside the kernel's ephemeral range (freePort), so a restart finds its port
// free again. A port taken before Postgres bound it: Postgres exits saying so, and starts again on
// another (startOnFreePort). Started means the server on the port is this one (its data directory).
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir, userInfo } from 'node:os';
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import { startEmbeddedPostgres, type EmbeddedPostgresOptions, type RunningPostgres } from '../src/fence/embedded-postgres.ts';
import { PortTakenError, startOnFreePort, type PortPicking } from '../src/ports.ts';
import { portTakenLine } from './ports.ts';

export interface PostgresOptions extends Omit<EmbeddedPostgresOptions, 'port'> {
  /** How the port is picked (tests of the retry hand in a taken one). */
  ports?: PortPicking;
}

/** An embedded Postgres on a free port (initialised first if `dataDir` is empty). */
export async function startPostgres(opts: PostgresOptions): Promise<RunningPostgres> {
  const { ports, ...embedded } = opts;
  return await startOnFreePort(async (port) => {
    const server = await startEmbeddedPostgres({ ...embedded, port }); // a port taken: PostgresPortInUseError (EADDRINUSE)
    try {
      await assertServes(server.url, opts.dataDir);
    } catch (err) {
      await server.stop().catch(() => {});
      throw err;
    }
    return server;
  }, ports);
}

/**
 * A migrated database `database` on an embedded Postgres of its own in a temporary folder, for one
 * run of a tool (a fuzzer, the tenancy harness): `run` gets its URL and a pool of 4; the server and
 * the folder are gone after.
 */
export async function withScratchDatabase<T>(
  o: { prefix: string; database: string; postgresFlags?: string[] },
  run: (db: { url: string; pool: pg.Pool }) => Promise<T>,
): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), o.prefix));
  chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
  const postgres = await startPostgres({ dataDir: join(dir, 'data'), postgresFlags: o.postgresFlags ?? [] });
  const url = new URL(postgres.url);
  url.pathname = `/${o.database}`;
  const pool = new pg.Pool({ connectionString: url.toString(), max: 4 });
  pool.on('error', () => {});
  try {
    const admin = new pg.Client({ connectionString: postgres.url });
    await admin.connect();
    await admin.query(`CREATE DATABASE ${pg.escapeIdentifier(o.database)}`).finally(() => admin.end());
    await migrate(pool);
    return await run({ url: url.toString(), pool });
  } finally {
    await pool.end();
    await postgres.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Throws PortTakenError unless the Postgres at `url` runs on `dataDir`. */
export async function assertServes(url: string, dataDir: string): Promise<void> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 });
  client.on('error', () => {});
  await client.connect();
  try {
    const { rows } = await client.query<{ data_directory: string }>('SHOW data_directory');
    const serving = rows[0]?.data_directory;
    if (serving !== resolve(dataDir))
      throw new PortTakenError(`the Postgres at port ${new URL(url).port} serves ${serving}, not ${resolve(dataDir)}`);
  } finally {
    await client.end().catch(() => {});
  }
}

/** As root, Postgres runs as the `postgres` user (startEmbeddedPostgres creates it). */
export function postgresIds(): { uid: number; gid: number } | Record<string, never> {
  if (userInfo().uid !== 0) return {};
  return { uid: Number(execFileSync('id', ['-u', 'postgres']).toString()), gid: Number(execFileSync('id', ['-g', 'postgres']).toString()) };
}

/** The embedded package's `postgres` binary. */
export async function postgresBinary(): Promise<string> {
  const mod = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as { postgres: string };
  return mod.postgres;
}

export interface PostgresProcess {
  child: ChildProcess;
  port: number;
  /** What it wrote to stderr so far. */
  output(): string;
}

/**
 * `postgres -D dataDir -p port` as a child of this process (so a test can stop it alone), on
 * 127.0.0.1; resolves once it accepts connections (read-only ones, for a standby). A port taken:
 * PortTakenError, for startOnFreePort to pick another. `binary`: another server's `postgres`
 * (default: the embedded package's).
 */
export async function runPostgres(dataDir: string, port: number, flags: string[] = [], binary?: string): Promise<PostgresProcess> {
  const child = spawn(
    binary ?? (await postgresBinary()),
    ['-D', dataDir, '-p', String(port), '-c', 'listen_addresses=127.0.0.1', ...flags],
    {
      ...postgresIds(),
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  let output = '';
  await new Promise<void>((ready, failed) => {
    child.stderr?.on('data', (d: Buffer) => {
      output += d.toString();
      if (output.includes('ready to accept')) ready();
    });
    child.once('error', failed);
    child.once('close', (code) => {
      const taken = portTakenLine(output);
      if (taken !== null) failed(new PortTakenError(`postgres on port ${port}: ${taken}`));
      else failed(new Error(`postgres -D ${dataDir} exited with ${code} during start:\n${output}`));
    });
  });
  return { child, port, output: () => output };
}
