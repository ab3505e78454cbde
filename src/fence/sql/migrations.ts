// The statements of migrating (migrate.ts). Bookkeeping lives in the fencepost schema
// (fencepost.migrations), beside what it describes.
import type { Query } from './query.ts';
import { DEFINITIONS_SHA256, DEFINITIONS_VERSION } from '../definitions.ts';

// Arbitrary constant: "fencepost" as a 64-bit advisory lock key.
const MIGRATION_LOCK_KEY = 4_669_143_214_093_120n;

export const noTimeouts = (): Query => ({ text: 'SET statement_timeout = 0; SET lock_timeout = 0' });
export const resetTimeouts = (): Query => ({ text: 'RESET statement_timeout; RESET lock_timeout' });
export const lock = (): Query => ({ text: 'SELECT pg_advisory_lock($1)', values: [MIGRATION_LOCK_KEY.toString()] });
export const unlock = (): Query => ({ text: 'SELECT pg_advisory_unlock($1)', values: [MIGRATION_LOCK_KEY.toString()] });
/** Creates the bookkeeping table, moving the one older versions kept in public. */
export const bookkeeping = (): Query => ({
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
});
export const applied = (): Query => ({ text: 'SELECT id FROM fencepost.migrations' });
/** A numbered migration file (migrations/NNNN_name.sql). */
export interface Migration {
  id: number;
  name: string;
  sql: string;
}

export const record = (m: Migration): Query => ({
  text: 'INSERT INTO fencepost.migrations (id, name) VALUES ($1, $2)',
  values: [m.id, m.name],
});
export const latestApplied = (): Query => ({ text: 'SELECT max(id) AS max FROM fencepost.migrations' });
export const definitions = (): Query => ({ text: 'SELECT version, sha256 FROM fencepost.definitions' });
export const recordDefinitions = (): Query => ({
  text: `INSERT INTO fencepost.definitions (version, sha256) VALUES ($1, $2)
ON CONFLICT (only_row) DO UPDATE SET version = EXCLUDED.version, sha256 = EXCLUDED.sha256, applied_at = now()`,
  values: [DEFINITIONS_VERSION, DEFINITIONS_SHA256],
});
