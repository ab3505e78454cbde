// `npm run chaos -- --seed N --duration-s S [--writers 4] [--proxies 2] [--fence-keys 2]
//   [--fence-mode strict|off|two-step] [--session-timeout-ms 2000] [--faults pause-writer,…]`
// A seeded fault-injection run against real processes, checked afterwards: exit 0 PASS, 1 FAIL (a
// violation, or a planned fault that could not be applied), 3 INCONCLUSIVE (tools/chaos/verdict.ts).
// `npm run chaos -- --fuzz-sql S [--seed N]` instead fuzzes the SQL endpoint's protocol for S seconds
// (tools/chaos/sql-fuzz.ts); exits 1 on a violation.
// `npm run chaos -- --tenancy S [--seed N] [--attacks <substring>] [--open]` runs the tenant-isolation
// harness (tools/tenancy/) for S seconds: every attack alone, then seeded mixes; --open includes the
// documented open lock-queue attacks (reported, and counted as violations when they break the bound).
import { parseArgs } from 'node:util';
import { FENCE_MODES, type FenceMode } from '../tools/unsafe-fence.ts';
import { FAULT_KINDS, type FaultKind } from '../tools/chaos/nemesis.ts';
import { MAX_SEED } from '../tools/chaos/prng.ts';
import { CHAOS_DEFAULTS, runChaos } from '../tools/chaos/run.ts';

const USAGE = `usage: npm run chaos -- [--seed <n>] [--duration-s <s>] [--writers <n>] [--proxies <n>] [--fence-keys <n>]
                      [--fence-mode ${FENCE_MODES.join('|')}] [--session-timeout-ms <n>]
                      [--faults <kind,…>] [--dir <run-dir>]
       npm run chaos -- --fuzz-sql <seconds> [--seed <n>]
       npm run chaos -- --tenancy <seconds> [--seed <n>] [--attacks <substring>] [--open]
  A seeded fault-injection run against real processes (3 ZooKeeper servers, Postgres, proxies, writers),
  checked afterwards. Exit 0 PASS, 1 FAIL (a violation, or a planned fault that could not be applied),
  3 INCONCLUSIVE (nothing written or no fault injected). --fuzz-sql fuzzes the SQL endpoint's protocol.
  defaults: --duration-s ${CHAOS_DEFAULTS.durationS} --writers ${CHAOS_DEFAULTS.writers} --proxies ${CHAOS_DEFAULTS.proxies} --fence-keys ${CHAOS_DEFAULTS.fenceKeyCount} --fence-mode ${CHAOS_DEFAULTS.fenceMode} --session-timeout-ms ${CHAOS_DEFAULTS.sessionTimeoutMs}; --seed random
  fault kinds: ${FAULT_KINDS.join(', ')}`;

let parsed;
try {
  parsed = parseArgs({
    options: {
      seed: { type: 'string' },
      'duration-s': { type: 'string', default: String(CHAOS_DEFAULTS.durationS) },
      writers: { type: 'string', default: String(CHAOS_DEFAULTS.writers) },
      proxies: { type: 'string', default: String(CHAOS_DEFAULTS.proxies) },
      'fence-keys': { type: 'string', default: String(CHAOS_DEFAULTS.fenceKeyCount) },
      'fence-mode': { type: 'string', default: CHAOS_DEFAULTS.fenceMode },
      'session-timeout-ms': { type: 'string', default: String(CHAOS_DEFAULTS.sessionTimeoutMs) },
      faults: { type: 'string' },
      dir: { type: 'string' },
      'fuzz-sql': { type: 'string' },
      tenancy: { type: 'string' },
      attacks: { type: 'string' },
      open: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
} catch (err) {
  process.stderr.write(`chaos: ${(err as Error).message}\n${USAGE}\n`);
  process.exit(2);
}
const { values } = parsed;
if (values.help) {
  process.stdout.write(USAGE + '\n');
  process.exit(0);
}

function whole(name: string, raw: string | undefined, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (raw === undefined || !/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
    process.stderr.write(`chaos: --${name} must be a whole number in ${min}…${max}, got ${JSON.stringify(raw)}\n`);
    process.exit(2);
  }
  return Number(raw);
}

const seed = values.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : whole('seed', values.seed, 0, MAX_SEED);
if (values['fuzz-sql'] !== undefined) {
  const { runSqlFuzz } = await import('../tools/chaos/sql-fuzz.ts');
  const fuzz = await runSqlFuzz({ seed, durationMs: whole('fuzz-sql', values['fuzz-sql'], 1) * 1000 });
  process.stdout.write(`\nfuzz-sql: seed ${fuzz.seed}, ${(fuzz.elapsedMs / 1000).toFixed(0)} s: ${fuzz.stats.summary()}\n`);
  if (fuzz.failure !== null) {
    process.stdout.write(
      `${fuzz.failure}\nFAIL: replay with npm run chaos -- --fuzz-sql <seconds> --seed ${fuzz.seed} (or FENCEPOST_FUZZ_SEED=${fuzz.seed} on test/proxy/sql/fuzz.test.ts)\n`,
    );
    process.exit(1);
  }
  process.stdout.write('PASS: no row landed in the protected table, no prepared transaction, the fence never moved\n');
  process.exit(0);
}

if (values.tenancy !== undefined) {
  const { runTenancyTool } = await import('../tools/tenancy/tool.ts');
  const ok = await runTenancyTool({
    seed,
    durationMs: whole('tenancy', values.tenancy, 1) * 1000,
    ...(values.attacks === undefined ? {} : { attacks: values.attacks }),
    open: values.open === true,
  });
  process.exit(ok ? 0 : 1);
}

const mode = values['fence-mode'] as FenceMode;
if (!FENCE_MODES.includes(mode)) {
  process.stderr.write(`chaos: --fence-mode must be one of ${FENCE_MODES.join(', ')}\n`);
  process.exit(2);
}
const kinds = values.faults?.split(',') as FaultKind[] | undefined;
if (kinds?.some((k) => !FAULT_KINDS.includes(k))) {
  process.stderr.write(`chaos: --faults takes a comma-separated subset of ${FAULT_KINDS.join(', ')}\n`);
  process.exit(2);
}

// Ctrl-C or SIGTERM: stop every process the run started (ZooKeeper, Postgres, proxies, writers).
const interrupt = new AbortController();
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => interrupt.abort(new Error(`chaos run interrupted (${sig})`)));

const result = await runChaos({
  signal: interrupt.signal,
  seed,
  durationMs: whole('duration-s', values['duration-s'], 1) * 1000,
  writers: whole('writers', values.writers, 2),
  proxies: whole('proxies', values.proxies, 1),
  fenceKeyCount: whole('fence-keys', values['fence-keys'], 1),
  fenceMode: mode,
  sessionTimeoutMs: whole('session-timeout-ms', values['session-timeout-ms'], 400),
  ...(kinds ? { kinds } : {}),
  ...(values.dir ? { dir: values.dir } : {}),
}).catch((err: unknown) => {
  if (!interrupt.signal.aborted) throw err;
  process.stderr.write(`${(err as Error).message}; every process stopped\n`);
  process.exit(130);
});
// The report ends with the verdict's line: PASS, FAIL (a violation, or a fault not applied), INCONCLUSIVE.
process.stdout.write('\n' + result.report + '\n');
process.exit(result.verdict.exitCode);
