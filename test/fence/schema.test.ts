// The schema is one thing whichever way a database got it: a fresh install, an upgrade from the
// schema of any earlier migration (its functions as those migrations left them), and the checked-in
// dump migrations/schema.sql (`npm run schema:dump` regenerates it) all agree.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { loadMigrations, migrate, migrationsApplied } from '../../src/fence/migrate.ts';
import { DEFINITIONS_SQL } from '../../src/fence/definitions.ts';
import { dumpSchema, SCHEMA_FILE } from '../../tools/schema-dump.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';

let fresh: TestDatabase;
let freshDump: string;

beforeAll(async () => {
  fresh = await createTestDatabase();
  freshDump = await dumpSchema(fresh.pool);
});
afterAll(() => fresh?.drop());

describe('one schema', () => {
  test('a fresh install matches migrations/schema.sql (regenerate it with npm run schema:dump)', (ctx) => {
    const checkedIn = readFileSync(SCHEMA_FILE, 'utf8');
    const server = /PostgreSQL (\d+)/.exec(freshDump)?.[1];
    const dumped = /PostgreSQL (\d+)/.exec(checkedIn)?.[1];
    // Catalog text differs across major versions (NOT NULL constraints, deparsing): compare like with like.
    if (server !== dumped) ctx.skip();
    expect(freshDump).toBe(checkedIn);
  });

  // Every earlier schema, upgraded by migrate(): the same schema as a fresh install, and ready.
  const earlier = loadMigrations().slice(0, -1).map((m) => m.id);
  test.each(earlier)('an upgrade from the schema of migration %i ends with the fresh install\'s schema', async (upTo) => {
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
