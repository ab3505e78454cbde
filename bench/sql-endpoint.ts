// Issue 15, the SQL endpoint (FENCEPOST_PGWIRE_PORT): pgbench through the endpoint against pgbench
// straight to Postgres, and through PgBouncer (transaction pooling) as the reference protocol proxy.
// 16 clients, one fence key and one token for every session of the endpoint (the leader's
// writes), two scripts over 5,000 rows: `transaction`, BEGIN; UPDATE one row; COMMIT, and
// `upsert`, one INSERT … ON CONFLICT DO UPDATE in an implicit transaction. The endpoint fences each
// connection at startup and then relays; client SQL runs as the open-mode client login, granted the table.
// One fresh Postgres, one `fencepost serve` with the endpoint on, one PgBouncer, for all runs.
// Every run also reads CPU per transaction of Postgres, the proxy, PgBouncer and pgbench
// (bench/cpu.ts), and runs once more with Postgres pinned to one core (bench/placement.ts).
// The path `protected` is the endpoint again, right after it, with app.counters protected by the
// sessions' fence key (`fencepost protect`, bench/protected.ts): the cost of the database check
// (the transaction script, shared placement only).
// The table is unprotected again before the next path (direct and PgBouncer writes would be refused).
// The path `relay` is the runtime's floor: a Node TCP relay with no logic (bench/floor-servers.ts)
// between pgbench and Postgres, its CPU in the proxy's column: what Node costs before the
// endpoint does anything.
//
// Equal-rate rounds: CPU per transaction depends on the rate as much as on the work (at a lower
// rate Postgres shares fewer WAL flushes and wakeups among transactions: the no-logic relay, which
// adds no statement, costs Postgres 1.1-1.35× direct at its own lower rate). So after the
// as-fast-as-it-goes runs, direct, endpoint and relay run again at one scheduled rate (pgbench -R,
// 60% of the slowest of them), alternating, BENCH_EQUAL_RATE_ROUNDS rounds (default 3), in each
// placement: the CPU table's "at … tx/s" rows are the medians per part, and the goals (Postgres
// ≤ 1.05× and the proxy ≤ 1.2× the relay's) are judged on them. Pinned, Postgres has a
// core of its own: its CPU is its own work, not also the proxy's use of a shared core.
//
// `node --import tsx bench/sql-endpoint.ts [direct|endpoint|protected|pgbouncer|relay|transaction|upsert…]`
// runs it alone (default: every path and script; `protected` brings `endpoint`, its pair) and prints
// its tables (BENCH_DURATION_S, BENCH_PLACEMENT, BENCH_MODES: prepared,simple,extended; default prepared,simple).
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import { protectTable, unprotectTable } from '../src/fence/protect.ts';
import { pgbouncerVersion, startPgbouncer, type Bouncer } from '../tools/pgbouncer.ts';
import { spawnServe } from './serve.ts';
import { startFloorServer, type FloorServer } from './floor.ts';
import { benchPostgres, dropBenchRole, fmt, machine, settleDisk } from './support.ts';
import { loadGeneratorVersions, runPgbench, type PgbenchOptions, type PgbenchResult } from './loadgen.ts';
import { expectRefused, pgbenchRate, protectedTable, trackFunctions, triggerCalls, triggerTime, type ProtectedPair } from './protected.ts';
import {
  childNamed,
  cpuTable,
  exitedChildrenProbe,
  measureCpu,
  postmasterPid,
  treeProbe,
  type CpuGoal,
  type CpuProbe,
  type CpuRow,
  type CpuWindow,
} from './cpu.ts';
import { pinnedDescription, place, placements, type Placement } from './placement.ts';

export type PgbenchMode = PgbenchOptions['mode'];
/** In the order they run, for each mode: `protected` right after `endpoint`, its pair. */
export const SQL_PATHS = ['direct', 'endpoint', 'protected', 'pgbouncer', 'relay'] as const;
export type SqlPath = (typeof SQL_PATHS)[number];
/**
 * The equal-rate rounds' rate, as a share of the slowest path's top rate: well below it, so no
 * path is saturated (a saturated path queues, and its CPU per transaction says so).
 */
const EQUAL_RATE_SHARE = 0.6;
/** The paths of the equal-rate rounds, in the order each round runs them. */
const EQUAL_RATE_PATHS: readonly SqlPath[] = ['direct', 'endpoint', 'relay'];
export const SQL_SCRIPTS = ['transaction', 'upsert'] as const;
export type SqlScript = (typeof SQL_SCRIPTS)[number];

export interface SqlEndpointRun {
  mode: PgbenchMode;
  path: SqlPath;
  script: SqlScript;
  placement: Placement;
  /** The mode pgbench ran in (PgBouncer 1.18 in transaction pooling cannot keep prepared statements: extended). */
  ranAs: PgbenchMode;
  result: PgbenchResult | null;
  /** CPU of Postgres, pgbench and (on their paths) the proxy or PgBouncer over the measured run. */
  cpu: CpuWindow | null;
  /** Why there is no result (e.g. pgbouncer not installed). */
  skipped?: string;
  /** An equal-rate round's (pgbench -R): the rate scheduled, and the round (1-based). */
  equalRate?: { rate: number; round: number };
}

export interface SqlEndpointReport {
  clients: number;
  durationS: number;
  runs: SqlEndpointRun[];
  /** `endpoint` and `protected` of each mode: the cost of the database check. */
  protected: ProtectedPair[];
  pgbouncerVersion: string;
}

export interface SqlEndpointBenchOptions {
  durationS: number;
  warmupS?: number;
  clients?: number;
  modes?: readonly PgbenchMode[];
  /** Default all; `protected` runs `endpoint` too. */
  paths?: readonly SqlPath[];
  /** Default both. */
  scripts?: readonly SqlScript[];
  /** Default from BENCH_PLACEMENT (both). */
  placements?: readonly Placement[];
  /** Equal-rate rounds of direct, endpoint and relay (shared placement); default BENCH_EQUAL_RATE_ROUNDS or 3, 0 for none. */
  equalRateRounds?: number;
  log?: (line: string) => void;
}

const ROWS = 5000;
const FENCE_KEY = 'bench-sql';
const SCRIPTS: Record<SqlScript, string> = {
  transaction: `\\set id random(1, ${ROWS})\nBEGIN;\nUPDATE app.counters SET n = n + 1 WHERE id = :id;\nCOMMIT;\n`,
  upsert: `\\set id random(1, ${ROWS})\nINSERT INTO app.counters AS c (id, n) VALUES (:id, 1) ON CONFLICT (id) DO UPDATE SET n = c.n + 1;\n`,
};
const SCRIPT_NAMES: Record<SqlScript, string> = {
  transaction: '`BEGIN; UPDATE; COMMIT`',
  upsert: 'upsert, implicit transaction',
};
const TABLE = 'app.counters';
/** The protected table's trigger function (fencepost schema). */
const TRIGGER = 'refuse_unfenced_write';
/**
 * Goals for a fenced connection's transactions through the endpoint (the connection fence): at
 * equal rate, Postgres ≤ 1.05× and the proxy ≤ 1.2× the no-logic relay's CPU (needs the `relay`
 * path in the same run); throughput ≥ 0.95× the relay's (RELAY_GOAL_RATIO).
 */
const endpointCpuGoals = (): readonly CpuGoal[] => [
  { part: 'postgres', maxRatio: 1.05, against: { path: PATH_NAMES.relay, name: 'the relay' } },
  { part: 'proxy', maxRatio: 1.2, against: { path: PATH_NAMES.relay, name: 'the relay' } },
];
/** The endpoint's throughput against the no-logic relay's, in the same run. */
export const RELAY_GOAL_RATIO = 0.95;

export async function runSqlEndpointBench(options: SqlEndpointBenchOptions): Promise<SqlEndpointReport> {
  const o = {
    warmupS: 1,
    clients: 16,
    modes: ['prepared', 'simple'] as readonly PgbenchMode[],
    paths: SQL_PATHS,
    scripts: SQL_SCRIPTS,
    placements: placements(),
    equalRateRounds: Number(process.env.BENCH_EQUAL_RATE_ROUNDS ?? 3),
    log: () => {},
    ...options,
  };
  const want = (p: SqlPath) => o.paths.includes(p) || (p === 'endpoint' && o.paths.includes('protected'));
  const db = await benchPostgres('fencepost_bench_sql_endpoint');
  const clientRole = `fpbench_sql_${process.pid}`;
  const sql = new pg.Pool({ connectionString: db.url, max: 2 });
  sql.on('error', () => {});
  let pgwirePort = 0;
  let proxy: Awaited<ReturnType<typeof spawnServe>> | null = null;
  let bouncer: Bouncer | null = null;
  let relay: FloorServer | null = null;
  const version = pgbouncerVersion();
  try {
    await migrate(sql);
    await sql.query('CREATE SCHEMA app');
    await sql.query('CREATE TABLE app.counters (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)');
    await sql.query('INSERT INTO app.counters (id) SELECT generate_series(1, $1)', [ROWS]);
    await sql.query('VACUUM ANALYZE app.counters');
    if (want('protected')) await trackFunctions(sql);
    proxy = await spawnServe(
      { DATABASE_URL: db.url, FENCEPOST_CLIENT_ROLE: clientRole, FENCEPOST_PGWIRE_MAX_CONNECTIONS: '200' },
      'strict',
      { pgwire: true },
    );
    pgwirePort = proxy.pgwirePort!;
    // The proxy created its client login at start; the endpoint's client SQL runs as it.
    const role = pg.escapeIdentifier(clientRole);
    await sql.query(`GRANT USAGE ON SCHEMA app TO ${role}`);
    await sql.query(`GRANT SELECT, INSERT, UPDATE ON app.counters TO ${role}`);
    const endpointUrl = new URL(db.url);
    endpointUrl.username = 'bench-leader';
    endpointUrl.password = '';
    endpointUrl.port = String(pgwirePort);
    const endpointEnv = { PGOPTIONS: `-c fencepost.token=1 -c fencepost.fence_key=${FENCE_KEY}` };
    // One fenced transaction first: a broken path would measure errors.
    const probe = async () => {
      const client = new pg.Client({ connectionString: endpointUrl.toString(), options: endpointEnv.PGOPTIONS });
      await client.connect();
      try {
        await client.query('BEGIN');
        await client.query(`UPDATE ${TABLE} SET n = n + 1 WHERE id = 1`);
        await client.query('COMMIT');
      } finally {
        await client.end();
      }
    };
    await probe();
    if (version !== 'not installed' && want('pgbouncer')) bouncer = await startPgbouncer(db.url, o.clients);
    const dbUrl = new URL(db.url);
    if (want('relay')) relay = await startFloorServer('relay', [dbUrl.hostname, dbUrl.port || '5432']);
    const relayUrl = new URL(db.url);
    if (relay) relayUrl.port = String(relay.port);
    const postmaster = await postmasterPid(db.url);
    const bouncerPid = bouncer ? childNamed('pgbouncer') : null;
    const placed = {
      postgres: postmaster,
      others: [proxy.pid, ...(bouncerPid === null ? [] : [bouncerPid]), ...(relay ? [relay.pid] : [])],
    };
    const probes = (path: SqlPath): CpuProbe[] => [
      ...(postmaster === null ? [] : [treeProbe('postgres', postmaster)]),
      ...(path === 'endpoint' || path === 'protected' ? [treeProbe('proxy', proxy!.pid)] : []),
      ...(path === 'relay' && relay ? [treeProbe('proxy', relay.pid)] : []),
      ...(path === 'pgbouncer' && bouncerPid !== null ? [treeProbe('pgbouncer', bouncerPid)] : []),
      exitedChildrenProbe(),
    ];
    /** pgbench's options on `path`: its URL, and the sessions' token and fence key through the endpoint. */
    const pgbenchOn = (path: SqlPath, script: SqlScript, mode: PgbenchMode): PgbenchOptions => {
      const viaEndpoint = path === 'endpoint' || path === 'protected';
      const url = path === 'direct' ? db.url : viaEndpoint ? endpointUrl.toString() : path === 'relay' ? relayUrl.toString() : bouncer!.url;
      return {
        url,
        scriptSql: SCRIPTS[script],
        clients: o.clients,
        mode,
        durationS: o.durationS,
        ...(viaEndpoint ? { env: endpointEnv } : {}),
      };
    };
    /** One measured run: placed, warmed up (then `afterWarmup`), the disk settled, CPU read around it. */
    const measured = async (path: SqlPath, placement: Placement, pgb: PgbenchOptions, afterWarmup = async () => {}) => {
      place(placement, placed);
      if (o.warmupS > 0) await runPgbench({ ...pgb, durationS: o.warmupS });
      await afterWarmup();
      await settleDisk(sql);
      return measureCpu(probes(path), () => runPgbench(pgb));
    };
    const runs: SqlEndpointRun[] = [];
    const pairs: ProtectedPair[] = [];
    try {
      for (const placement of o.placements) {
        for (const mode of o.modes) {
          for (const script of o.scripts) {
            // The protected pair measures the database check: once, on the transaction, sharing the cores.
            const paths = SQL_PATHS.filter((p) => want(p) && (p !== 'protected' || (script === 'transaction' && placement === 'shared')));
            for (const path of paths) {
              const ranAs: PgbenchMode = path === 'pgbouncer' && mode === 'prepared' ? 'extended' : mode;
              const at = { mode, path, script, placement, ranAs };
              if (path === 'pgbouncer' && !bouncer) {
                runs.push({ ...at, result: null, cpu: null, skipped: 'pgbouncer not installed (scripts/setup.sh --bench)' });
                continue;
              }
              const pgb = pgbenchOn(path, script, ranAs);
              if (path === 'protected') {
                await protectTable(sql, TABLE, FENCE_KEY);
                await expectRefused(sql, `UPDATE ${TABLE} SET n = n WHERE id = 1`);
                await probe();
              }
              let before = { calls: 0, ms: 0 };
              let after = before;
              try {
                o.log(`sql endpoint: pgbench -M ${ranAs} ${script} ${path}, ${placement}, ${o.clients} clients, ${o.durationS} s`);
                const { result, cpu } = await measured(path, placement, pgb, async () => {
                  if (path === 'protected') before = await triggerCalls(sql, TRIGGER);
                });
                runs.push({ ...at, result, cpu });
                if (path === 'protected') after = await triggerCalls(sql, TRIGGER);
              } finally {
                if (path === 'protected') await unprotectTable(sql, TABLE);
              }
              const unprotected =
                path === 'protected'
                  ? runs.find((r) => r.mode === mode && r.path === 'endpoint' && r.script === script && r.placement === placement)?.result
                  : undefined;
              if (unprotected) {
                const run = runs.at(-1)!.result!;
                pairs.push({
                  door: `SQL endpoint, pgbench -M ${mode}`,
                  protection: `table ${TABLE} (statement trigger)`,
                  inFlight: o.clients,
                  unprotected: pgbenchRate(unprotected),
                  protected: pgbenchRate(run),
                  inPostgres: triggerTime(TRIGGER, before, after, run.transactions),
                });
              }
            }
            const equal = EQUAL_RATE_PATHS.filter(want);
            const fastest = equal.map((p) =>
              runs.find((r) => r.mode === mode && r.script === script && r.placement === placement && r.path === p),
            );
            if (o.equalRateRounds <= 0 || equal.length < 2 || fastest.some((r) => !r?.result)) continue;
            const rate = Math.max(50, Math.floor((EQUAL_RATE_SHARE * Math.min(...fastest.map((r) => r!.result!.tps))) / 50) * 50);
            for (let round = 1; round <= o.equalRateRounds; round++) {
              for (const path of equal) {
                o.log(
                  `sql endpoint: pgbench -M ${mode} ${script} ${path} at ${rate} tx/s, ${placement}, round ${round} of ${o.equalRateRounds}`,
                );
                const { result, cpu } = await measured(path, placement, { ...pgbenchOn(path, script, mode), rate });
                runs.push({ mode, path, script, placement, ranAs: mode, result, cpu, equalRate: { rate, round } });
              }
            }
          }
        }
      }
    } finally {
      place('shared', placed);
    }
    return { clients: o.clients, durationS: o.durationS, runs, protected: pairs, pgbouncerVersion: version };
  } finally {
    await bouncer?.stop().catch(() => {});
    await relay?.stop().catch(() => {});
    await proxy?.stop();
    await sql.end();
    await db.stop();
    await dropBenchRole(clientRole);
  }
}

const PATH_NAMES: Record<SqlPath, string> = {
  direct: 'direct to Postgres',
  endpoint: 'fencepost SQL endpoint (fenced)',
  protected: `fencepost SQL endpoint (fenced), ${TABLE} protected`,
  pgbouncer: 'PgBouncer, transaction pooling',
  relay: 'Node TCP relay, no logic (the floor)',
};

export function sqlEndpointTable(r: SqlEndpointReport): string {
  const v = loadGeneratorVersions();
  const out = [
    `SQL endpoint: pgbench ${v.pgbench} (2 threads), ${r.clients} clients, over 5,000 rows of app.counters: \`BEGIN; UPDATE app.counters SET n = n + 1 WHERE id = :id; COMMIT;\`, and the upsert \`INSERT INTO app.counters AS c (id, n) VALUES (:id, 1) ON CONFLICT (id) DO UPDATE SET n = c.n + 1;\` alone (an implicit transaction); through the endpoint every session has token 1 on one fence key (\`PGOPTIONS='-c fencepost.token=1 -c fencepost.fence_key=${FENCE_KEY}'\`), so every transaction is fenced; PgBouncer ${r.pgbouncerVersion} (transaction pooling, pool ${r.clients}, SCRAM) as the reference protocol proxy; ${r.durationS} s each after 1 s of warm-up, one Postgres and one \`fencepost serve\` for all runs, every process on every core (the CPU table has the pinned runs).`,
    '',
    '| pgbench -M | statement | path | tx/s | × direct | goal | p50 ms | p99 ms | p99 × direct | failed |',
    '|---|---|---|---:|---:|---|---:|---:|---:|---:|',
  ];
  const shared = r.runs.filter((x) => x.placement === 'shared' && x.equalRate === undefined);
  for (const run of shared) {
    const same = (path: SqlPath) => shared.find((x) => x.mode === run.mode && x.script === run.script && x.path === path)?.result;
    const direct = same('direct');
    const mode = run.ranAs === run.mode ? run.mode : `${run.ranAs} (for ${run.mode})`;
    if (!run.result) {
      out.push(`| ${mode} | ${SCRIPT_NAMES[run.script]} | ${PATH_NAMES[run.path]} | – | | | | | | ${run.skipped ?? ''} |`);
      continue;
    }
    const x = run.result;
    const ratio = direct ? x.tps / direct.tps : NaN;
    let goal = '';
    if (run.path === 'endpoint') {
      const relay = same('relay');
      if (relay) goal = `≥ ${RELAY_GOAL_RATIO}× the relay: ${x.tps >= RELAY_GOAL_RATIO * relay.tps ? 'yes' : '**no**'}`;
    }
    out.push(
      `| ${mode} | ${SCRIPT_NAMES[run.script]} | ${PATH_NAMES[run.path]} | ${fmt(x.tps, 0)} | ${run.path === 'direct' ? '1' : fmt(ratio, 2)}× | ${goal} | ${fmt(x.p50Ms, 2)} | ${fmt(x.p99Ms, 2)} | ${direct ? fmt(x.p99Ms / direct.p99Ms, 1) : '–'}× | ${x.failed} |`,
    );
  }
  return out.join('\n');
}

/** The runs for the CPU table (bench/cpu.ts): a scenario per pgbench mode and statement. */
export function sqlEndpointCpuRows(r: SqlEndpointReport): CpuRow[] {
  return [
    ...r.runs.flatMap((run): CpuRow[] => {
      if (!run.result || !run.cpu || run.equalRate !== undefined) return [];
      const x = run.result;
      const mode = run.ranAs === run.mode ? run.mode : `${run.ranAs} (for ${run.mode})`;
      return [
        {
          scenario: `SQL endpoint, ${SCRIPT_NAMES[run.script]}, pgbench -M ${run.mode}`,
          path: `${PATH_NAMES[run.path]}${mode === run.mode ? '' : `, -M ${mode}`}`,
          direct: run.path === 'direct',
          placement: run.placement,
          perS: x.tps,
          p50Ms: x.p50Ms,
          p99Ms: x.p99Ms,
          ops: x.transactions,
          failed: x.failed,
          cpu: run.cpu,
        },
      ];
    }),
    ...equalRateRows(r),
  ];
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

/**
 * The equal-rate rounds, one row per (mode, script, path): each part's median CPU per transaction
 * over the rounds, the median rate, latencies and window. The goals are judged here.
 */
function equalRateRows(r: SqlEndpointReport): CpuRow[] {
  const rows: CpuRow[] = [];
  const rated = r.runs.filter((x) => x.equalRate !== undefined && x.result && x.cpu);
  const groups = new Map<string, SqlEndpointRun[]>();
  for (const run of rated) {
    const k = [run.mode, run.script, run.path, run.placement, run.equalRate!.rate].join('\u0000');
    groups.set(k, [...(groups.get(k) ?? []), run]);
  }
  for (const g of groups.values()) {
    const first = g[0]!;
    // Each part's median µs per transaction, over the median window and transaction count: per
    // transaction the table reads the median itself, and the cores kept busy stay meaningful.
    const ops = Math.round(median(g.map((x) => x.result!.transactions)));
    const parts = new Set(g.flatMap((x) => Object.keys(x.cpu!.us) as (keyof CpuWindow['us'])[]));
    const us: CpuWindow['us'] = {};
    for (const part of parts) {
      const perTx = g.flatMap((x) =>
        x.cpu!.us[part] === undefined || x.result!.transactions === 0 ? [] : [x.cpu!.us[part]! / x.result!.transactions],
      );
      if (perTx.length > 0) us[part] = median(perTx) * ops;
    }
    rows.push({
      scenario: `SQL endpoint, ${SCRIPT_NAMES[first.script]}, pgbench -M ${first.mode}, at ${first.equalRate!.rate} tx/s (median of ${g.length} alternating rounds)`,
      path: PATH_NAMES[first.path],
      direct: first.path === 'direct',
      placement: first.placement,
      perS: median(g.map((x) => x.result!.tps)),
      p50Ms: median(g.map((x) => x.result!.p50Ms)),
      p99Ms: median(g.map((x) => x.result!.p99Ms)),
      ops,
      failed: g.reduce((n, x) => n + x.result!.failed, 0),
      cpu: { seconds: median(g.map((x) => x.cpu!.seconds)), us },
      ...(first.path === 'endpoint' ? { goals: endpointCpuGoals() } : {}),
    });
  }
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const asked = process.argv.slice(2);
  const known = [...SQL_PATHS, ...SQL_SCRIPTS] as readonly string[];
  const unknown = asked.filter((a) => !known.includes(a));
  if (unknown.length > 0) {
    process.stderr.write(`unknown path or script ${unknown.join(', ')}; choose from ${known.join(', ')}\n`);
    process.exit(2);
  }
  const paths = asked.filter((a): a is SqlPath => (SQL_PATHS as readonly string[]).includes(a));
  const scripts = asked.filter((a): a is SqlScript => (SQL_SCRIPTS as readonly string[]).includes(a));
  const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
  const modes = process.env.BENCH_MODES?.split(',').filter((m): m is PgbenchMode => ['prepared', 'simple', 'extended'].includes(m));
  const report = await runSqlEndpointBench({
    durationS,
    ...(modes !== undefined && modes.length > 0 ? { modes } : {}),
    paths: paths.length > 0 ? paths : SQL_PATHS,
    scripts: scripts.length > 0 ? scripts : SQL_SCRIPTS,
    log: (line) => process.stderr.write(`[bench] ${line}\n`),
  });
  const tables = [
    sqlEndpointTable(report),
    cpuTable(sqlEndpointCpuRows(report), { pinnedCpus: pinnedDescription() }),
    protectedTable(report.protected, durationS),
  ].filter((t) => t !== '');
  process.stdout.write(`Measured on: ${machine()}; ${new Date().toISOString().slice(0, 10)}.\n\n${tables.join('\n\n')}\n`);
}
