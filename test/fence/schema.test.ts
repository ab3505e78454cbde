// The schema is one thing whichever way a database got it: a fresh install, an upgrade from the
// schema of any earlier migration (its functions as those migrations left them), the checked-in
// dump migrations/schema.sql (`npm run schema:dump` regenerates it), and that dump applied to an
// empty database all agree.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { loadMigrations, migrate, migrationsApplied } from '../../src/fence/migrate.ts';
import { DEFINITIONS_SQL } from '../../src/fence/definitions.ts';
import { dumpedOn, dumpSchema, SCHEMA_FILE } from '../../tools/schema-dump.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { adminQuery, uniqueRole } from '../support/keys.ts';

let fresh: TestDatabase;
let freshDump: string;

beforeAll(async () => {
  fresh = await createTestDatabase();
  freshDump = await dumpSchema(fresh.pool);
});
afterAll(() => fresh?.drop());

describe('one schema', () => {
  test('a fresh install matches migrations/schema.sql (regenerate it with npm run schema:dump)', () => {
    const checkedIn = readFileSync(SCHEMA_FILE, 'utf8');
    // Postgres deparses views and functions differently across major versions: the file is compared
    // on the major it was dumped on (the embedded Postgres's), and a run on another one says so.
    expect(
      dumpedOn(freshDump),
      `migrations/schema.sql was dumped on PostgreSQL ${dumpedOn(checkedIn)}: run this test on it (unset DATABASE_URL for the embedded one)`,
    ).toBe(dumpedOn(checkedIn));
    expect(freshDump).toBe(checkedIn);
  });

  test('migrations/schema.sql applies to an empty database and makes the same schema', async () => {
    const db = await createTestDatabase({ migrate: false, poolSize: 2 });
    try {
      await db.pool.query(readFileSync(SCHEMA_FILE, 'utf8'));
      expect(await dumpSchema(db.pool)).toBe(freshDump);
    } finally {
      await db.drop();
    }
  });

  // Every earlier schema, upgraded by migrate(): the same schema as a fresh install, and ready.
  const earlier = loadMigrations()
    .slice(0, -1)
    .map((m) => m.id);
  test.each(earlier)("an upgrade from the schema of migration %i ends with the fresh install's schema", async (upTo) => {
    const db = await createTestDatabase({ migrate: false, poolSize: 2 });
    try {
      await migrate(db.pool, { upTo });
      expect(await migrationsApplied(db.pool)).toBe(false);
      await migrate(db.pool);
      expect(await migrationsApplied(db.pool)).toBe(true);
      expect(await dumpSchema(db.pool)).toBe(freshDump);
    } finally {
      await db.drop();
    }
  });

  test('the definitions are current: applying them again changes nothing, and migrate() does not re-apply them', async () => {
    await fresh.pool.query(DEFINITIONS_SQL);
    expect(await dumpSchema(fresh.pool)).toBe(freshDump);
    expect(await migrate(fresh.pool)).toEqual([]);
  });

  test('definitions recorded by a newer version are left alone (a rolling upgrade never takes functions back)', async () => {
    const db = await createTestDatabase({ poolSize: 2 });
    try {
      await db.pool.query(`UPDATE fencepost.definitions SET version = version + 1, sha256 = 'newer'`);
      expect(await migrate(db.pool)).toEqual([]);
      expect(await migrationsApplied(db.pool)).toBe(true);
      // The same version with other text (a definition changed in development) is applied again.
      await db.pool.query(`UPDATE fencepost.definitions SET version = version - 1, sha256 = 'changed'`);
      expect(await migrate(db.pool)).toHaveLength(1);
    } finally {
      await db.drop();
    }
  });
});

describe('migration 19: the client functions move to schema fencepost_api', () => {
  test('roles the fence was granted to lose USAGE on schema fencepost; migration 20 drops the epoch sequences', async () => {
    const db = await createTestDatabase({ migrate: false, poolSize: 2 });
    const role = uniqueRole('m19');
    await adminQuery(`CREATE ROLE ${role} NOLOGIN`);
    try {
      await migrate(db.pool, { upTo: 18 });
      // As 0.2 left them: its fence function (a definition, so not made by the migrations), a
      // key's role as its provisioning granted it, an epoch sequence.
      await db.pool.query(`CREATE FUNCTION fencepost.fence_session(text, text, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1'`);
      await db.pool
        .query(`GRANT USAGE ON SCHEMA fencepost TO ${role}; GRANT EXECUTE ON FUNCTION fencepost.fence_session(text, text, bigint) TO ${role};
                           CREATE SEQUENCE fencepost.epoch_00; GRANT SELECT ON SEQUENCE fencepost.epoch_00 TO PUBLIC`);
      await migrate(db.pool);
      const { rows } = await db.pool.query(
        `SELECT has_schema_privilege($1, 'fencepost', 'USAGE') AS fence, to_regclass('fencepost.epoch_00') IS NOT NULL AS epoch,
                to_regprocedure('fencepost.fence_session(text, text, bigint)') IS NULL AS moved`,
        [role],
      );
      expect(rows[0]).toEqual({ fence: false, epoch: false, moved: true });
    } finally {
      await db.pool.query(`DROP OWNED BY ${role}`);
      await db.drop();
      await adminQuery(`DROP ROLE IF EXISTS ${role}`);
    }
  });
});

describe('migration 20: the connection fence replaces the epochs', () => {
  // Invariant: an upgrade leaves every protected table enforced by the new check (its trigger with
  // the fence key as its one argument), and no raise runs DDL (no epoch, no trigger that makes one).
  test("a protected table's trigger gets its one argument; the epochs and their trigger are gone", async () => {
    const db = await createTestDatabase({ migrate: false, poolSize: 2 });
    try {
      await migrate(db.pool, { upTo: 19 });
      // As 0.2 left it: the protected table's trigger function (a definition, not made by the migrations).
      await db.pool.query(`CREATE FUNCTION fencepost.refuse_unfenced_write() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'`);
      await db.pool.query(`CREATE TABLE public.ledger (id int PRIMARY KEY);
        INSERT INTO fencepost.protected_tables (relation, fence_key) VALUES ('public.ledger'::regclass, 'books');
        CREATE SEQUENCE fencepost.epoch_11;
        CREATE TRIGGER fencepost_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON public.ledger FOR EACH STATEMENT
          EXECUTE FUNCTION fencepost.refuse_unfenced_write('books', 'fencepost.epoch_11')`);
      await migrate(db.pool);
      const { rows } = await db.pool.query(
        `SELECT (SELECT enforced FROM fencepost.protected_data WHERE target = 'ledger') AS enforced,
                to_regclass('fencepost.epoch_11') IS NULL AS epoch_gone,
                NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'fences_next_epoch') AS old_trigger_gone,
                EXISTS (SELECT FROM pg_trigger WHERE tgname = 'fences_revoke_older' AND tgrelid = 'fencepost.fences'::regclass) AS revoke_trigger`,
      );
      expect(rows[0]).toEqual({ enforced: true, epoch_gone: true, old_trigger_gone: true, revoke_trigger: true });
      await expect(db.pool.query('INSERT INTO public.ledger VALUES (1)')).rejects.toMatchObject({ code: 'FP403' });
    } finally {
      await db.drop();
    }
  });
});
