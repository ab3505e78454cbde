// Numbered raw .sql files in migrations/, each applied once in its own transaction and recorded;
// then the current definitions of the schema's functions and views (definitions.ts), applied in a
// transaction of their own whenever they differ from what the database records. A session
// advisory lock serialises instances that start together.
import { readdirSync, readFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import type { Query } from './queries.ts';
import { sqlState } from './pg-errors.ts';
import { DEFINITIONS_SHA256, DEFINITIONS_SQL, DEFINITIONS_VERSION } from './definitions.ts';
import { withClient } from './checkout.ts';
import { INVALID_SCHEMA_NAME, UNDEFINED_TABLE } from './sqlstate.ts';

export const MIGRATIONS_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'migrations');

// Arbitrary constant: "fencepost" as a 64-bit advisory lock key.
const MIGRATION_LOCK_KEY = 4_669_143_214_093_120n;

export interface Migration {
  id: number;
  name: string;
  sql: string;
}

export function loadMigrations(dir = MIGRATIONS_DIR): Migration[] {
  const files = readdirSync(dir).filter((f) => /^\d+_[\w-]+\.sql$/.test(f));
  const migrations = files
    .map((name) => ({ id: Number.parseInt(name, 10), name, sql: readFileSync(join(dir, name), 'utf8') }))
    .sort((a, b) => a.id - b.id);
  migrations.forEach((m, i) => {
    if (m.id !== i + 1) throw new Error(`migrations must be numbered 1, 2, 3…: found ${m.name} at position ${i + 1}`);
  });
  return migrations;
}

// The statements of migrating, as named builders. Bookkeeping lives in the fencepost schema
// (fencepost.migrations), beside what it describes.
const q = {
  noTimeouts: (): Query => ({ text: 'SET statement_timeout = 0; SET lock_timeout = 0' }),
  resetTimeouts: (): Query => ({ text: 'RESET statement_timeout; RESET lock_timeout' }),
  lock: (): Query => ({ text: 'SELECT pg_advisory_lock($1)', values: [MIGRATION_LOCK_KEY.toString()] }),
  unlock: (): Query => ({ text: 'SELECT pg_advisory_unlock($1)', values: [MIGRATION_LOCK_KEY.toString()] }),
  /** Creates the bookkeeping table, moving the one older versions kept in public. */
  bookkeeping: (): Query => ({
    text: `
CREATE SCHEMA IF NOT EXISTS fencepost;
DO $$ BEGIN
  IF to_regclass('public.fencepost_migrations') IS NOT NULL AND to_regclass('fencepost.migrations') IS NULL THEN
    ALTER TABLE public.fencepost_migrations SET SCHEMA fencepost;
    ALTER TABLE fencepost.fencepost_migrations RENAME TO migrations;
  END IF;
END $$;
CREATE TABLE IF NOT EXISTS fencepost.migrations (
  id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
  }),
  applied: (): Query => ({ text: 'SELECT id FROM fencepost.migrations' }),
  record: (m: Migration): Query => ({ text: 'INSERT INTO fencepost.migrations (id, name) VALUES ($1, $2)', values: [m.id, m.name] }),
  latestApplied: (): Query => ({ text: 'SELECT max(id) AS max FROM fencepost.migrations' }),
  definitions: (): Query => ({ text: 'SELECT version, sha256 FROM fencepost.definitions' }),
  recordDefinitions: (): Query => ({
    text: `INSERT INTO fencepost.definitions (version, sha256) VALUES ($1, $2)
ON CONFLICT (only_row) DO UPDATE SET version = EXCLUDED.version, sha256 = EXCLUDED.sha256, applied_at = now()`,
    values: [DEFINITIONS_VERSION, DEFINITIONS_SHA256],
  }),
};

/** What migrate() reports when it applied the definitions. */
export const DEFINITIONS_APPLIED = `definitions v${DEFINITIONS_VERSION}`;

export interface MigrateOptions {
  dir?: string;
  /**
   * Stop after this migration, leaving the definitions as those migrations made them: the schema
   * of an older version, for upgrade tests and benchmarks. Default: every migration.
   */
  upTo?: number;
}

/** The database's definitions need this version's: missing, older, or the same version changed. */
function definitionsDue(recorded: { version: number; sha256: string } | undefined): boolean {
  if (recorded === undefined || recorded.version < DEFINITIONS_VERSION) return true;
  return recorded.version === DEFINITIONS_VERSION && recorded.sha256 !== DEFINITIONS_SHA256;
}

/**
 * Applies pending migrations, then the current definitions when due; returns what it applied now
 * (migration file names, and DEFINITIONS_APPLIED).
 */
export async function migrate(pool: pg.Pool, opts: MigrateOptions = {}): Promise<string[]> {
  const all = loadMigrations(opts.dir);
  const migrations = opts.upTo === undefined ? all : all.filter((m) => m.id <= opts.upTo!);
  const applied: string[] = [];
  // On failure the connection is closed rather than pooled: it may still hold the session lock.
  await withClient(pool, async (client, checkout) => {
    // Migrations (and waiting for another instance's) may take long: no statement or lock timeout
    // here (the proxy's pool sets both; pg_advisory_lock waits are lock waits).
    await client.query(q.noTimeouts());
    await client.query(q.lock());
    try {
      await client.query(q.bookkeeping());
      const { rows } = await client.query<{ id: number }>(q.applied());
      const done = new Set(rows.map((r) => r.id));
      for (const m of migrations) {
        if (done.has(m.id)) continue;
        await client.query('BEGIN');
        try {
          await client.query(m.sql);
          await client.query(q.record(m));
          await client.query('COMMIT');
        } catch (err) {
          await client.query('ROLLBACK');
          throw new Error(`migration ${m.name} failed`, { cause: err });
        }
        applied.push(m.name);
      }
      if (opts.upTo === undefined && (await applyDefinitions(client))) applied.push(DEFINITIONS_APPLIED);
    } catch (err) {
      checkout.discard(err);
      throw err;
    } finally {
      await client.query(q.unlock());
      await client.query(q.resetTimeouts());
    }
  });
  return applied;
}

async function applyDefinitions(client: pg.PoolClient): Promise<boolean> {
  const { rows } = await client.query<{ version: number; sha256: string }>(q.definitions());
  if (!definitionsDue(rows[0])) return false;
  await client.query('BEGIN');
  try {
    await client.query(DEFINITIONS_SQL);
    await client.query(q.recordDefinitions());
    await client.query('COMMIT');
  } catch (err) {
    await client.query('ROLLBACK');
    throw new Error(`applying the current definitions (v${DEFINITIONS_VERSION}) failed`, { cause: err });
  }
  return true;
}

/** True when every migration file has been applied, and the current definitions (or newer). */
export async function migrationsApplied(pool: pg.Pool, dir = MIGRATIONS_DIR): Promise<boolean> {
  const latest = loadMigrations(dir).at(-1)?.id ?? 0;
  try {
    const { rows } = await pool.query<{ max: number | null }>(q.latestApplied());
    if ((rows[0]?.max ?? 0) < latest) return false;
    const defs = await pool.query<{ version: number; sha256: string }>(q.definitions());
    return !definitionsDue(defs.rows[0]);
  } catch (err) {
    if (sqlState(err) === UNDEFINED_TABLE || sqlState(err) === INVALID_SCHEMA_NAME) return false;
    throw err;
  }
}
