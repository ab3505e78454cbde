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
import { assertFuzz, controlWrite, prepareFuzzDatabase, runCase, FuzzStats, INTRUDERS, type FuzzCase, type FuzzTarget } from '../../support/pgwire-fuzz.ts';

const SEED = Number(process.env.FENCEPOST_FUZZ_SEED ?? 20240611);
const RUNS = Number(process.env.FENCEPOST_FUZZ_RUNS ?? 150);
const MAX_MESSAGES = 12;
/**
 * A session the endpoint has not closed 2 s after its Terminate is stalled; a backend that outlives
 * its session by 3 s lingers: each is dropped, counted, and fails the run (no message order may
 * hang a session or keep a backend).
 */
const WAITS = { closeWaitMs: 2000, lingerMs: 3000 };

/**
 * Counterexamples the fuzzer found, shrunk, replayed on every run (they fail until fixed).
 * 1. seed 777 (FENCEPOST_FUZZ_RUNS=400, openTable hunt): a tokenless session's transaction is not
 *    fenced, so nothing opens the fence's temporary table, and PREPARE TRANSACTION succeeds: a
 *    prepared transaction of the client login is left in pg_prepared_xacts (read-only, but it
 *    holds its locks and the xmin horizon until an operator ends it; max_prepared_transactions of
 *    them exhaust the slots). Shrunk by fast-check to the extended form below; the simple
 *    `BEGIN; PREPARE TRANSACTION 'fz'` does the same.
 */
const FOUND: { name: string; case: FuzzCase }[] = [
  {
    name: "tokenless: Parse/Bind/Execute PREPARE TRANSACTION 'fz', then BEGIN",
    case: {
      session: 'tokenless',
      delivery: 'fragmented',
      pieces: [1],
      messages: [
        { type: 'Parse', name: '', sql: "PREPARE TRANSACTION 'fz'" },
        { type: 'Bind', portal: '', statement: '', values: [] },
        { type: 'Execute', portal: '', maxRows: 0 },
        { type: 'Parse', name: '', sql: 'BEGIN' },
        { type: 'Bind', portal: '', statement: '', values: [] },
        { type: 'Execute', portal: '', maxRows: 0 },
      ],
    },
  },
  { name: "tokenless: Query BEGIN; PREPARE TRANSACTION 'fz'", case: { session: 'tokenless', delivery: 'pipelined', pieces: [1], messages: [{ type: 'Query', sql: "BEGIN; PREPARE TRANSACTION 'fz'" }] } },
];

const test = sqlTest;
let target: FuzzTarget | undefined;

test.beforeAll(async ({ db, sql }) => {
  const clientLogin = clientRoleFor(db.url);
  await prepareFuzzDatabase(db.pool, clientLogin);
  target = { pool: db.pool, host: '127.0.0.1', port: sql.port, database: sql.database, clientLogin };
});

describe('the SQL endpoint under a protocol fuzzer', () => {
  test('control: a session at the fence\'s current token lands a row with a simple Query (the check sees writes)', async () => {
    const stats = new FuzzStats();
    expect(await controlWrite(target!, stats)).toBe(1);
  });

  for (const found of FOUND) {
    // Known hole, reported (a tokenless session may PREPARE TRANSACTION): left failing until fixed.
    test(`found by the fuzzer: ${found.name} leaves no prepared transaction`, async () => {
      await runCase(target!, found.case, new FuzzStats(), WAITS);
    });
  }

  test(`random message sequences of stale, tokenless and other-key sessions land no row in the protected table, leave no prepared transaction, never move the fence (seed ${SEED}, ${RUNS} runs)`, async () => {
    const stats = new FuzzStats();
    await assertFuzz(target!, { seed: SEED, numRuns: RUNS, maxMessages: MAX_MESSAGES, sessions: INTRUDERS, stats, ...WAITS });
    console.log(`fuzz (intruders): ${stats.summary()}\n${[...stats.stalledCases, ...stats.lingeringCases.map((l) => 'lingering: ' + l)].join('\n\n')}`);
    // Not vacuous: the sequences reached the fence and the table's trigger.
    expect(stats.errors.get('FP409') ?? 0).toBeGreaterThan(0);
    expect(stats.errors.get('FP403') ?? 0).toBeGreaterThan(0);
    expect({ stalled: stats.stalled, lingering: stats.lingeringBackends }).toEqual({ stalled: 0, lingering: 0 });
  }, 120_000);

  test(`random message sequences of a session at the current token never move the fence nor leave a prepared transaction (seed ${SEED})`, async () => {
    const stats = new FuzzStats();
    await assertFuzz(target!, { seed: SEED + 1, numRuns: Math.ceil(RUNS / 4), maxMessages: MAX_MESSAGES, sessions: ['current'], stats, ...WAITS });
    console.log(`fuzz (current token): ${stats.summary()}\n${[...stats.stalledCases, ...stats.lingeringCases.map((l) => 'lingering: ' + l)].join('\n\n')}`);
    expect({ stalled: stats.stalled, lingering: stats.lingeringBackends }).toEqual({ stalled: 0, lingering: 0 });
  }, 120_000);
});
