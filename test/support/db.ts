// A fresh, migrated database per test file on the run's shared Postgres.
import pg from 'pg';
import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { migrate } from '../../src/fence/migrate.ts';

export interface TestDatabase {
  url: string;
  pool: pg.Pool;
  drop(): Promise<void>;
}

/**
 * The client-login name (FENCEPOST_CLIENT_ROLE) for a test database: roles are cluster-wide, so
 * each test database gets logins of its own, dropped with it.
 */
export function clientRoleFor(databaseUrlOrPool: string | pg.Pool): string {
  // A pool made from a URL keeps it; createPool's keeps the parsed settings (src/fence/database-url.ts).
  const options =
    typeof databaseUrlOrPool === 'string'
      ? { connectionString: databaseUrlOrPool }
      : (databaseUrlOrPool as unknown as { options: { connectionString?: string; database?: string } }).options;
  const name = options.connectionString !== undefined ? new URL(options.connectionString).pathname.slice(1) : (options.database ?? '');
  return `fpc_${name.replace(/^fp_test_/, '').replace(/[^a-z0-9_]/g, '_')}`.slice(0, 40);
}

export function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

export async function createTestDatabase(opts: { migrate?: boolean; poolSize?: number } = {}): Promise<TestDatabase> {
  const adminUrl = inject('databaseUrl');
  const name = `fp_test_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = withDatabase(adminUrl, name);
  const pool = new pg.Pool({ connectionString: url, max: opts.poolSize ?? 10 });
  pool.on('error', () => {});
  if (opts.migrate !== false) await migrate(pool);
  return {
    url,
    pool,
    drop: async () => {
      await pool.end();
      const a = new pg.Client({ connectionString: adminUrl });
      await a.connect();
      await a.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      const { rows } = await a.query<{ rolname: string }>(`SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1)`, [
        clientRoleFor(url),
      ]);
      for (const r of rows) await a.query(`DROP ROLE IF EXISTS ${pg.escapeIdentifier(r.rolname)}`);
      await a.end();
    },
  };
}
