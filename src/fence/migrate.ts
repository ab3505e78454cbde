// Numbered raw .sql files in migrations/, each applied once in its own transaction and recorded;
// then the current definitions of the schema's functions and views (definitions.ts), applied in a
// transaction of their own whenever they differ from what the database records. A session
// advisory lock serialises instances that start together.
import { readdirSync, readFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import * as q from './sql/migrations.ts';
import { sqlState } from './pg-errors.ts';
import { DEFINITIONS_SHA256, DEFINITIONS_SQL, DEFINITIONS_VERSION } from './definitions.ts';
import { withClient } from './checkout.ts';
import { INVALID_SCHEMA_NAME, UNDEFINED_TABLE } from './sqlstate.ts';

export const MIGRATIONS_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'migrations');

import type { Migration } from './sql/migrations.ts';

export type { Migration } from './sql/migrations.ts';

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
