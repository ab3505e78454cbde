// The SQL endpoint's refusal while a Postgres failover could lose a fence raise
// (FENCEPOST_REQUIRE_SYNC_STANDBY=1; the test Postgres has no standby, so the reason is
// no_sync_standby for the whole file) under the seeded protocol fuzzer (tools/chaos/pgwire-fuzz.ts):
// random message sequences of every kind of session, the current token's included, land no row in
// any table, make no fence, move no fence and leave no prepared transaction.
import { describe, expect } from 'vitest';
import { sqlTest } from '../support/fixtures.ts';
import { clientRoleFor } from '../support/db.ts';
import {
  assertFuzz,
  controlWrite,
  prepareFuzzDatabase,
  runCase,
  FuzzStats,
  FUZZ_WAITS as WAITS,
  INTRUDERS,
  PREPARE_FINDS as PREPARES,
  type FuzzTarget,
} from '../../tools/chaos/pgwire-fuzz.ts';
import { DURABILITY_UNSAFE } from '../../src/fence/codes.ts';

const SEED = Number(process.env.FENCEPOST_FUZZ_SEED ?? 20261201);
const RUNS = Number(process.env.FENCEPOST_FUZZ_RUNS ?? 100);

// No spare backends: each case checks that no backend of the client login outlives its session.
const test = sqlTest.extend('sqlEnv', { scope: 'file' }, { FENCEPOST_REQUIRE_SYNC_STANDBY: '1', FENCEPOST_PGWIRE_SPARE_BACKENDS: '0' });
let target: FuzzTarget | undefined;

test.beforeAll(async ({ db, sql }) => {
  const clientLogin = clientRoleFor(db.url);
  await prepareFuzzDatabase(db.pool, clientLogin);
  target = { pool: db.pool, host: '127.0.0.1', port: sql.port, database: sql.database, clientLogin };
});

describe('the SQL endpoint refusing writes, under a protocol fuzzer', () => {
  test('the control write of a session at the current token lands nothing', async () => {
    expect(await controlWrite(target!, new FuzzStats())).toBe(0);
  });

  for (const p of PREPARES) {
    test(`${p.name} leaves no prepared transaction: the refusal's read-only transaction rules it out as the fence does`, async () => {
      await runCase(target!, p.case, new FuzzStats(), { ...WAITS, nothingLands: true });
    });
  }

  test(`random message sequences of current, stale, tokenless and other-key sessions land nothing anywhere and leave no prepared transaction (seed ${SEED}, ${RUNS} runs)`, async () => {
    const stats = new FuzzStats();
    await assertFuzz(target!, {
      seed: SEED,
      numRuns: RUNS,
      maxMessages: 12,
      sessions: ['current', ...INTRUDERS],
      openTable: true,
      nothingLands: true,
      stats,
      ...WAITS,
    });
    console.log(`fuzz (refusing writes): ${stats.summary()}`);
    // Not vacuous: the sequences met the refusal.
    expect(stats.errors.get(DURABILITY_UNSAFE) ?? 0).toBeGreaterThan(0);
    expect({ stalled: stats.stalled, lingering: stats.lingeringBackends }).toEqual({ stalled: 0, lingering: 0 });
  }, 180_000);
});
