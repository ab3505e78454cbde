// Debian's Postgres 15 server (package postgresql-15, /usr/lib/postgresql/15/bin) as a cluster of a
// test file's own, for what the run's Postgres (the embedded 18) cannot serve: Debian's pg_dump is
// version 15 and aborts against a newer server ("server version mismatch"), and the run's cluster
// preloads no library (pg_stat_statements needs shared_preload_libraries). Trust authentication on
// 127.0.0.1, so a test may also log in straight to Postgres as any role it made, the endpoint's
// client login included. scripts/setup.sh --test installs the package.
import { execFile } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { startOnFreePort } from '../../src/ports.ts';
import { migrate } from '../../src/fence/migrate.ts';
import { postgresIds, runPostgres } from '../../tools/postgres.ts';
import { withDatabase, type TestDatabase } from './db.ts';

const BIN = '/usr/lib/postgresql/15/bin';
const SUPERUSER = 'fencepost';

export interface DebianPostgres {
  /** The superuser's URL (database `postgres`). */
  url: string;
  /** A fresh database on it, migrated as createTestDatabase's (dropped with the cluster). */
  createDatabase(name: string): Promise<TestDatabase>;
  /** Stops the server (fast shutdown) and removes its folder. */
  stop(): Promise<void>;
}

export const debianPostgresInstalled = (): boolean => existsSync(join(BIN, 'postgres'));

/** initdb and start a cluster with the `postgres` flags given (e.g. `['-c', 'shared_preload_libraries=…']`). */
export async function startDebianPostgres(flags: string[] = []): Promise<DebianPostgres> {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-debian-pg-'));
  chmodSync(dir, 0o755); // as root, Postgres runs as the postgres user
  const ids = postgresIds();
  if ('uid' in ids) chownSync(dir, ids.uid, ids.gid);
  const dataDir = join(dir, 'data');
  await promisify(execFile)(join(BIN, 'initdb'), ['-D', dataDir, '-U', SUPERUSER, '--auth=trust', '-E', 'UTF8', '--locale=C.UTF-8'], ids);
  const server = await startOnFreePort((port) =>
    runPostgres(dataDir, port, ['-c', `unix_socket_directories=${dir}`, ...flags], join(BIN, 'postgres')),
  );
  const url = `postgres://${SUPERUSER}@127.0.0.1:${server.port}/postgres`;
  const pools: pg.Pool[] = [];
  return {
    url,
    createDatabase: async (name) => {
      const admin = new pg.Client({ connectionString: url });
      await admin.connect();
      await admin.query(`CREATE DATABASE ${pg.escapeIdentifier(name)}`).finally(() => admin.end());
      const dbUrl = withDatabase(url, name);
      const pool = new pg.Pool({ connectionString: dbUrl, max: 4 });
      pool.on('error', () => {});
      pools.push(pool);
      await migrate(pool);
      return { url: dbUrl, pool, drop: async () => {} };
    },
    stop: async () => {
      await Promise.all(pools.map((p) => p.end().catch(() => {})));
      if (server.child.exitCode === null) {
        const exited = new Promise((resolve) => server.child.once('exit', resolve));
        server.child.kill('SIGINT');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
