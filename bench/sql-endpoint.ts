// Issue 15, the SQL endpoint (FENCEPOST_PGWIRE_PORT): pgbench through the endpoint against pgbench
// straight to Postgres, and through PgBouncer (transaction pooling) as the reference protocol proxy.
// 16 clients, one fence key and one token for every session of the endpoint (the leader's
// writes), each transaction BEGIN; UPDATE one of 5,000 rows; COMMIT. The endpoint fences every
// transaction inside itself; client SQL runs as the open-mode client login, granted the table.
// One fresh Postgres, one `fencepost serve` with the endpoint on, one PgBouncer, for all runs.
// The path `protected` is the endpoint again, right after it, with app.counters protected by the
// sessions' fence key (`fencepost protect`, bench/protected.ts): the cost of the database check.
// The table is unprotected again before the next path (direct and PgBouncer writes would be refused).
//
// `node --import tsx bench/sql-endpoint.ts [direct|endpoint|protected|pgbouncer…]` runs it alone
// (default: every path; `protected` brings `endpoint`, its pair) and prints its tables (BENCH_DURATION_S).
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import { protectTable, unprotectTable } from '../src/fence/protect.ts';
import { freePort } from '../tools/zookeeper/local-server.ts';
import { pgbouncerVersion, startPgbouncer, type Bouncer } from '../tools/pgbouncer.ts';
import { spawnServe } from './serve.ts';
import { benchPostgres, fmt, machine } from './support.ts';
import { loadGeneratorVersions, runPgbench, type PgbenchOptions, type PgbenchResult } from './loadgen.ts';
import { expectRefused, pgbenchRate, protectedTable, trackFunctions, triggerCalls, triggerTime, type ProtectedPair } from './protected.ts';

export type PgbenchMode = PgbenchOptions['mode'];
/** In the order they run, for each mode: `protected` right after `endpoint`, its pair. */
export const SQL_PATHS = ['direct', 'endpoint', 'protected', 'pgbouncer'] as const;
export type SqlPath = (typeof SQL_PATHS)[number];

export interface SqlEndpointRun {
  mode: PgbenchMode;
  path: SqlPath;
  /** The mode pgbench ran in (PgBouncer 1.18 in transaction pooling cannot keep prepared statements: extended). */
  ranAs: PgbenchMode;
  result: PgbenchResult | null;
  /** Why there is no result (e.g. pgbouncer not installed). */
  skipped?: string;
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
  log?: (line: string) => void;
}

export const GOAL_RATIO = 0.5;
const ROWS = 5000;
const FENCE_KEY = 'bench-sql';
const SCRIPT = `\\set id random(1, ${ROWS})\nBEGIN;\nUPDATE app.counters SET n = n + 1 WHERE id = :id;\nCOMMIT;\n`;
const TABLE = 'app.counters';
/** The protected table's trigger function (fencepost schema). */
const TRIGGER = 'refuse_unfenced_write';

export async function runSqlEndpointBench(options: SqlEndpointBenchOptions): Promise<SqlEndpointReport> {
  const o = { warmupS: 1, clients: 16, modes: ['prepared', 'simple'] as readonly PgbenchMode[], paths: SQL_PATHS, log: () => {}, ...options };
  const want = (p: SqlPath) => o.paths.includes(p) || (p === 'endpoint' && o.paths.includes('protected'));
  const db = await benchPostgres('fencepost_bench_sql_endpoint');
  const clientRole = `fpbench_sql_${process.pid}`;
  const sql = new pg.Pool({ connectionString: db.url, max: 2 });
  sql.on('error', () => {});
  const pgwirePort = await freePort();
  let proxy: Awaited<ReturnType<typeof spawnServe>> | null = null;
  let bouncer: Bouncer | null = null;
  const version = pgbouncerVersion();
  try {
    await migrate(sql);
    await sql.query('CREATE SCHEMA app');
    await sql.query('CREATE TABLE app.counters (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)');
    await sql.query('INSERT INTO app.counters (id) SELECT generate_series(1, $1)', [ROWS]);
    await sql.query('VACUUM ANALYZE app.counters');
    if (want('protected')) await trackFunctions(sql);
    proxy = await spawnServe({ DATABASE_URL: db.url, FENCEPOST_CLIENT_ROLE: clientRole, FENCEPOST_PGWIRE_PORT: String(pgwirePort), FENCEPOST_PGWIRE_MAX_CONNECTIONS: '200' });
    // The proxy created its client login at start; the endpoint's client SQL runs as it.
    const role = pg.escapeIdentifier(clientRole);
    await sql.query(`GRANT USAGE ON SCHEMA app TO ${role}`);
    await sql.query(`GRANT SELECT, UPDATE ON app.counters TO ${role}`);
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
    const runs: SqlEndpointRun[] = [];
    const pairs: ProtectedPair[] = [];
    for (const mode of o.modes) {
      for (const path of SQL_PATHS.filter(want)) {
        const ranAs: PgbenchMode = path === 'pgbouncer' && mode === 'prepared' ? 'extended' : mode;
        if (path === 'pgbouncer' && !bouncer) {
          runs.push({ mode, path, ranAs, result: null, skipped: 'pgbouncer not installed (scripts/setup.sh --bench)' });
          continue;
        }
        const viaEndpoint = path === 'endpoint' || path === 'protected';
        const url = path === 'direct' ? db.url : viaEndpoint ? endpointUrl.toString() : bouncer!.url;
        const pgb: PgbenchOptions = { url, scriptSql: SCRIPT, clients: o.clients, mode: ranAs, durationS: o.durationS, ...(viaEndpoint ? { env: endpointEnv } : {}) };
        if (path === 'protected') {
          await protectTable(sql, TABLE, FENCE_KEY);
          await expectRefused(sql, `UPDATE ${TABLE} SET n = n WHERE id = 1`);
          await probe();
        }
        let before = { calls: 0, ms: 0 };
        let after = before;
        try {
          o.log(`sql endpoint: pgbench -M ${ranAs} ${path}, ${o.clients} clients, ${o.durationS} s`);
          if (o.warmupS > 0) await runPgbench({ ...pgb, durationS: o.warmupS });
          if (path === 'protected') before = await triggerCalls(sql, TRIGGER);
          runs.push({ mode, path, ranAs, result: await runPgbench(pgb) });
          if (path === 'protected') after = await triggerCalls(sql, TRIGGER);
        } finally {
          if (path === 'protected') await unprotectTable(sql, TABLE);
        }
        const unprotected = path === 'protected' ? runs.find((r) => r.mode === mode && r.path === 'endpoint')?.result : undefined;
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
    }
    return { clients: o.clients, durationS: o.durationS, runs, protected: pairs, pgbouncerVersion: version };
  } finally {
    await bouncer?.stop().catch(() => {});
    await proxy?.stop();
    await sql.end();
    await db.stop();
    if (process.env.DATABASE_URL) {
      const c = new pg.Client({ connectionString: process.env.DATABASE_URL });
      await c.connect().then(() => c.query(`DROP ROLE IF EXISTS ${pg.escapeIdentifier(clientRole)}`)).catch(() => {});
      await c.end().catch(() => {});
    }
  }
}

const PATH_NAMES: Record<SqlPath, string> = {
  direct: 'direct to Postgres',
  endpoint: 'fencepost SQL endpoint (fenced)',
  protected: `fencepost SQL endpoint (fenced), ${TABLE} protected`,
  pgbouncer: 'PgBouncer, transaction pooling',
};

export function sqlEndpointTable(r: SqlEndpointReport): string {
  const v = loadGeneratorVersions();
  const out = [
    `SQL endpoint: pgbench ${v.pgbench} (2 threads), ${r.clients} clients, \`BEGIN; UPDATE app.counters SET n = n + 1 WHERE id = :id; COMMIT;\` over 5,000 rows; through the endpoint every session has token 1 on one fence key (\`PGOPTIONS='-c fencepost.token=1 -c fencepost.fence_key=${FENCE_KEY}'\`), so every transaction is fenced; PgBouncer ${r.pgbouncerVersion} (transaction pooling, pool ${r.clients}, SCRAM) as the reference protocol proxy; ${r.durationS} s each after 1 s of warm-up, one Postgres and one \`fencepost serve\` for all runs.`,
    '',
    '| pgbench -M | path | tx/s | × direct | goal | p50 ms | p99 ms | p99 × direct | failed |',
    '|---|---|---:|---:|---|---:|---:|---:|---:|',
  ];
  for (const run of r.runs) {
    const direct = r.runs.find((x) => x.mode === run.mode && x.path === 'direct')?.result;
    const mode = run.ranAs === run.mode ? run.mode : `${run.ranAs} (for ${run.mode})`;
    if (!run.result) {
      out.push(`| ${mode} | ${PATH_NAMES[run.path]} | – | | | | | | ${run.skipped ?? ''} |`);
      continue;
    }
    const x = run.result;
    const ratio = direct ? x.tps / direct.tps : NaN;
    const goal = direct && (run.path === 'endpoint' || run.path === 'protected') ? `≥ ${GOAL_RATIO}×: ${ratio >= GOAL_RATIO ? 'yes' : '**no**'}` : '';
    out.push(
      `| ${mode} | ${PATH_NAMES[run.path]} | ${fmt(x.tps, 0)} | ${run.path === 'direct' ? '1' : fmt(ratio, 2)}× | ${goal} | ${fmt(x.p50Ms, 2)} | ${fmt(x.p99Ms, 2)} | ${direct ? fmt(x.p99Ms / direct.p99Ms, 1) : '–'}× | ${x.failed} |`,
    );
  }
  return out.join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const asked = process.argv.slice(2);
  const unknown = asked.filter((a) => !(SQL_PATHS as readonly string[]).includes(a));
  if (unknown.length > 0) {
    process.stderr.write(`unknown path ${unknown.join(', ')}; choose from ${SQL_PATHS.join(', ')}\n`);
    process.exit(2);
  }
  const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
  const report = await runSqlEndpointBench({ durationS, paths: asked.length > 0 ? (asked as SqlPath[]) : SQL_PATHS, log: (line) => process.stderr.write(`[bench] ${line}\n`) });
  const tables = [sqlEndpointTable(report), protectedTable(report.protected, durationS)].filter((t) => t !== '');
  process.stdout.write(`Measured on: ${machine()}; ${new Date().toISOString().slice(0, 10)}.\n\n${tables.join('\n\n')}\n`);
}
