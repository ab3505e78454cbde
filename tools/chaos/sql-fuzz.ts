// `npm run chaos -- --fuzz-sql <seconds> [--seed N]`: the SQL endpoint's protocol fuzzer
// (tools/chaos/pgwire-fuzz.ts, the property test/proxy/sql/fuzz.test.ts runs a bounded number of
// cases of in `npm test`) for as long as asked, with every session kind at once (stale, tokenless,
// another fence key, and the current token as the control), on an embedded Postgres of its own
// (prepared transactions enabled) and an in-process proxy. Prints the seed first, fast-check's
// report (seed, path, the shrunk counterexample) on a violation.
import { portRangeEnv } from '../ports.ts';
import pino from 'pino';
import { loadConfig } from '../../src/proxy/config.ts';
import { startProxy } from '../../src/proxy/server.ts';
import { withScratchDatabase } from '../postgres.ts';
import { assertFuzz, controlWrite, prepareFuzzDatabase, FuzzStats, FUZZ_WAITS } from './pgwire-fuzz.ts';

export interface SqlFuzzOptions {
  seed: number;
  durationMs: number;
  /** Messages per case at most. Default 12, as in npm test. */
  maxMessages?: number;
  print?: (line: string) => void;
}

export interface SqlFuzzResult {
  ok: boolean;
  seed: number;
  stats: FuzzStats;
  /** fast-check's report when the property failed. */
  failure: string | null;
  elapsedMs: number;
}

const CLIENT_ROLE = 'fpc_fuzz';

export async function runSqlFuzz(o: SqlFuzzOptions): Promise<SqlFuzzResult> {
  const print = o.print ?? ((l: string) => process.stdout.write(l + '\n'));
  const stats = new FuzzStats();
  const started = Date.now();
  return await withScratchDatabase(
    { prefix: 'fencepost-fuzz-sql-', database: 'fuzz', postgresFlags: ['-c', 'max_prepared_transactions=10'] },
    async ({ url, pool }) => {
      const config = loadConfig({
        DATABASE_URL: url,
        PORT: '0',
        FENCEPOST_PGWIRE_PORT: '0',
        // Each case checks that no backend of the client login outlives its session: no spares.
        FENCEPOST_PGWIRE_SPARE_BACKENDS: '0',
        FENCEPOST_CLIENT_ROLE: CLIENT_ROLE,
        FENCEPOST_LOG_LEVEL: 'silent',
        ...portRangeEnv(),
      });
      const proxy = await startProxy(config, pino({ level: 'silent' }));
      try {
        await prepareFuzzDatabase(pool, CLIENT_ROLE);
        const target = { pool, host: '127.0.0.1', port: proxy.pgwirePort!, database: 'fuzz', clientLogin: CLIENT_ROLE };
        if ((await controlWrite(target, stats)) !== 1)
          throw new Error('control: a session at the current token could not write the protected table: the fuzzer would see nothing');
        print(
          `fuzz-sql: seed ${o.seed}, ${(o.durationMs / 1000).toFixed(0)} s, sequences of at most ${o.maxMessages ?? 12} messages, sessions stale/tokenless/otherKey/current`,
        );
        const ticker = setInterval(() => print(`  ${((Date.now() - started) / 1000).toFixed(0)} s: ${stats.summary()}`), 30_000);
        let failure: string | null = null;
        try {
          await assertFuzz(target, {
            seed: o.seed,
            numRuns: Number.MAX_SAFE_INTEGER,
            maxMessages: o.maxMessages ?? 12,
            sessions: ['stale', 'tokenless', 'otherKey', 'current'],
            timeLimitMs: o.durationMs,
            stats,
            // A session still open 2 s after its Terminate, or a backend 3 s after its session: a failure.
            ...FUZZ_WAITS,
          });
          if (stats.stalled > 0 || stats.lingeringBackends > 0) {
            failure = `${stats.stalled} stalled sessions, ${stats.lingeringBackends} lingering backends:\n${[...stats.stalledCases, ...stats.lingeringCases.map((l) => `lingering: ${l}`)].join('\n\n')}`;
          }
        } catch (err) {
          failure = err instanceof Error ? err.message : String(err);
        } finally {
          clearInterval(ticker);
        }
        return { ok: failure === null, seed: o.seed, stats, failure, elapsedMs: Date.now() - started };
      } finally {
        await proxy.close();
      }
    },
  );
}
