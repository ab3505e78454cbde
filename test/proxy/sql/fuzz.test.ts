// The SQL endpoint under a seeded protocol fuzzer (test/support/pgwire-fuzz.ts): random
// interleavings of Parse/Bind/Describe/Execute/Close/Flush/Sync/Query and COPY messages from a
// stale, a tokenless and another fence key's session never land a row in a protected table, never
// leave a prepared transaction and never move the fence (read in Postgres by the owner after each
// case), and never hang a session or keep its backend. The control proves the check can see a
// write. FENCEPOST_FUZZ_SEED / FENCEPOST_FUZZ_RUNS override the fixed seed and the number of runs;
// `npm run chaos -- --fuzz-sql <seconds>` runs it for longer with a random seed.
import { describe, expect } from 'vitest';
import { sqlTest } from '../../support/fixtures.ts';
import { clientRoleFor } from '../../support/db.ts';
import {
  assertFuzz,
  controlWrite,
  prepareFuzzDatabase,
  runCase,
  FuzzStats,
  FUZZ_WAITS as WAITS,
  INTRUDERS,
  PREPARE_FINDS,
  type FuzzTarget,
} from '../../support/pgwire-fuzz.ts';

const SEED = Number(process.env.FENCEPOST_FUZZ_SEED ?? 20240611);
const RUNS = Number(process.env.FENCEPOST_FUZZ_RUNS ?? 150);
const MAX_MESSAGES = 12;

const test = sqlTest;
let target: FuzzTarget | undefined;

test.beforeAll(async ({ db, sql }) => {
  const clientLogin = clientRoleFor(db.url);
  await prepareFuzzDatabase(db.pool, clientLogin);
  target = { pool: db.pool, host: '127.0.0.1', port: sql.port, database: sql.database, clientLogin };
});

describe('the SQL endpoint under a protocol fuzzer', () => {
  test("control: a session at the fence's current token lands a row with a simple Query (the check sees writes)", async () => {
    const stats = new FuzzStats();
    expect(await controlWrite(target!, stats)).toBe(1);
  });

  for (const found of PREPARE_FINDS) {
    test(`found by the fuzzer: ${found.name} leaves no prepared transaction`, async () => {
      await runCase(target!, found.case, new FuzzStats(), WAITS);
    });
  }

  test(`random message sequences of stale, tokenless and other-key sessions land no row in the protected table, leave no prepared transaction, never move the fence (seed ${SEED}, ${RUNS} runs)`, async () => {
    const stats = new FuzzStats();
    await assertFuzz(target!, { seed: SEED, numRuns: RUNS, maxMessages: MAX_MESSAGES, sessions: INTRUDERS, stats, ...WAITS });
    console.log(
      `fuzz (intruders): ${stats.summary()}\n${[...stats.stalledCases, ...stats.lingeringCases.map((l) => 'lingering: ' + l)].join('\n\n')}`,
    );
    // Not vacuous: the sequences reached the fence and the table's trigger.
    expect(stats.errors.get('FP409') ?? 0).toBeGreaterThan(0);
    expect(stats.errors.get('FP403') ?? 0).toBeGreaterThan(0);
    expect({ stalled: stats.stalled, lingering: stats.lingeringBackends }).toEqual({ stalled: 0, lingering: 0 });
  }, 120_000);

  test(`random message sequences of a session at the current token never move the fence nor leave a prepared transaction (seed ${SEED})`, async () => {
    const stats = new FuzzStats();
    await assertFuzz(target!, {
      seed: SEED + 1,
      numRuns: Math.ceil(RUNS / 4),
      maxMessages: MAX_MESSAGES,
      sessions: ['current'],
      stats,
      ...WAITS,
    });
    console.log(
      `fuzz (current token): ${stats.summary()}\n${[...stats.stalledCases, ...stats.lingeringCases.map((l) => 'lingering: ' + l)].join('\n\n')}`,
    );
    expect({ stalled: stats.stalled, lingering: stats.lingeringBackends }).toEqual({ stalled: 0, lingering: 0 });
  }, 120_000);
});
