// The SQL endpoint under a seeded protocol fuzzer (tools/chaos/pgwire-fuzz.ts): random
// interleavings of Parse/Bind/Describe/Execute/Close/Flush/Sync/Query and COPY messages from a
// tokenless session, another fence key's, and a stale one (a token below the fence refused at
// startup; a connection fenced at the current token revoked by a raise mid-sequence) never land a
// row in a protected table (for the revoked one: after its raise), never prepare a transaction
// that wrote it, and never move the fence but by the case's own raise (read in Postgres by the
// owner after each case), and never hang a session or keep its backend. What a case prepares (a
// transaction of unprotected writes may be prepared) is committed by the owner before the read, so
// a protected write hidden in it would show. The controls prove the check sees a write, and a
// prepared one. FENCEPOST_FUZZ_SEED / FENCEPOST_FUZZ_RUNS override the fixed seed and the number
// of runs; `npm run chaos -- --fuzz-sql <seconds>` runs it for longer with a random seed.
import { describe, expect } from 'vitest';
import { sqlTest } from '../../support/fixtures.ts';
import { clientRoleFor } from '../../support/db.ts';
import {
  assertFuzz,
  controlWrite,
  prepareFuzzDatabase,
  resolvePrepared,
  runCase,
  GUARDED,
  FuzzStats,
  FUZZ_WAITS as WAITS,
  INTRUDERS,
  PREPARE_FINDS,
  type FuzzTarget,
} from '../../../tools/chaos/pgwire-fuzz.ts';

const SEED = Number(process.env.FENCEPOST_FUZZ_SEED ?? 20240611);
const RUNS = Number(process.env.FENCEPOST_FUZZ_RUNS ?? 150);
const MAX_MESSAGES = 12;

// No spare backends (src/proxy/sql/spares.ts): each case checks that no backend of the client
// login outlives its session, and a spare is one by design, for the next connect.
const test = sqlTest.extend('sqlEnv', { scope: 'file' }, { FENCEPOST_PGWIRE_SPARE_BACKENDS: '0' } as Record<string, string>);
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

  test('control: a write of the protected table in a prepared transaction is seen (the check sees prepared writes)', async () => {
    // The owner's, its triggers off (a superuser's replica role) so that the write goes in.
    const client = await target!.pool.connect();
    try {
      await client.query(
        `SET session_replication_role = replica; BEGIN; INSERT INTO ${GUARDED} VALUES (60, 'prepared'); PREPARE TRANSACTION 'fz_control'`,
      );
      expect(await resolvePrepared(target!.pool)).toEqual({ gids: ['fz_control'], protectedWrites: ['fz_control'] });
      await client.query(`DELETE FROM ${GUARDED} WHERE id = 60`);
    } finally {
      await client.query('RESET session_replication_role').catch(() => {});
      client.release();
    }
  });

  for (const found of PREPARE_FINDS) {
    test(`PREPARE TRANSACTION, ${found.name}: no prepared transaction wrote the protected table, and what it prepared is resolved`, async () => {
      await runCase(target!, found.case, new FuzzStats(), WAITS);
    });
  }

  test(`random message sequences of stale (refused at startup; revoked mid-sequence), tokenless and other-key sessions land no row in the protected table, prepare no write of it, never move the fence but by the case's raise (seed ${SEED}, ${RUNS} runs)`, async () => {
    const stats = new FuzzStats();
    await assertFuzz(target!, { seed: SEED, numRuns: RUNS, maxMessages: MAX_MESSAGES, sessions: INTRUDERS, stats, ...WAITS });
    console.log(
      `fuzz (intruders): ${stats.summary()}\n${[...stats.stalledCases, ...stats.lingeringCases.map((l) => 'lingering: ' + l)].join('\n\n')}`,
    );
    // Not vacuous: stale tokens were refused at startup, raises revoked sessions mid-sequence (whose
    // next request was answered FP409), and the sequences reached the table's trigger.
    expect(stats.refusedAtStartup).toBeGreaterThan(0);
    expect(stats.raises).toBeGreaterThan(0);
    expect(stats.errors.get('FP409') ?? 0).toBeGreaterThan(stats.refusedAtStartup);
    expect(stats.errors.get('FP403') ?? 0).toBeGreaterThan(0);
    expect({ stalled: stats.stalled, lingering: stats.lingeringBackends }).toEqual({ stalled: 0, lingering: 0 });
  }, 120_000);

  test(`random message sequences of a session at the current token never move the fence nor prepare a write of the protected table (seed ${SEED})`, async () => {
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
