// Where Postgres spends a fenced transaction, statement by statement: pg_stat_statements with
// track = all (statements inside the fence functions included) over one pgbench run per path,
// direct and through the SQL endpoint, `BEGIN; UPDATE; COMMIT` and the single-statement upsert,
// -M prepared and simple. Times are pg_stat_statements' execution times: wall time inside the
// backend (waits for locks and for a CPU included), so read the shares, not the absolute µs.
//
// `BENCH_DURATION_S=5 node --import tsx bench/statements.ts` (needs pgbench: scripts/setup.sh --bench).
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import { spawnServe } from './serve.ts';
import { benchPostgres, dropBenchRole } from './support.ts';
import { runPgbench, type PgbenchOptions } from './loadgen.ts';

const ROWS = 5000;
const FENCE_KEY = 'bench-statements';
const SCRIPTS = {
  transaction: `\\set id random(1, ${ROWS})\nBEGIN;\nUPDATE app.counters SET n = n + 1 WHERE id = :id;\nCOMMIT;\n`,
  upsert: `\\set id random(1, ${ROWS})\nINSERT INTO app.counters (id, n) VALUES (:id, 1) ON CONFLICT (id) DO UPDATE SET n = app.counters.n + 1;\n`,
};
const TOP = 14;

interface StatementRow {
  calls: string;
  total_ms: number;
  toplevel: boolean;
  query: string;
}

async function main(): Promise<void> {
  const durationS = Number(process.env.BENCH_DURATION_S ?? 5);
  const db = await benchPostgres('fencepost_bench_statements', {
    postgresFlags: [
      '-c',
      'shared_preload_libraries=pg_stat_statements',
      '-c',
      'pg_stat_statements.track=all',
      '-c',
      'pg_stat_statements.track_utility=on',
    ],
  });
  const sql = new pg.Pool({ connectionString: db.url, max: 2 });
  sql.on('error', () => {});
  const clientRole = `fpbench_stmt_${process.pid}`;
  let proxy: Awaited<ReturnType<typeof spawnServe>> | null = null;
  try {
    await migrate(sql);
    await sql.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
    await sql.query('CREATE SCHEMA app');
    await sql.query('CREATE TABLE app.counters (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)');
    await sql.query('INSERT INTO app.counters (id) SELECT generate_series(1, $1)', [ROWS]);
    proxy = await spawnServe(
      { DATABASE_URL: db.url, FENCEPOST_CLIENT_ROLE: clientRole, FENCEPOST_PGWIRE_MAX_CONNECTIONS: '200' },
      'strict',
      { pgwire: true },
    );
    const role = pg.escapeIdentifier(clientRole);
    await sql.query(`GRANT USAGE ON SCHEMA app TO ${role}`);
    await sql.query(`GRANT SELECT, INSERT, UPDATE ON app.counters TO ${role}`);
    const endpoint = new URL(db.url);
    endpoint.username = 'bench-leader';
    endpoint.password = '';
    endpoint.port = String(proxy.pgwirePort);
    const env = { PGOPTIONS: `-c fencepost.token=1 -c fencepost.fence_key=${FENCE_KEY}` };
    const out: string[] = [
      `Postgres time by statement (pg_stat_statements, track = all: statements inside functions indented), ${durationS} s of pgbench, 16 clients, per path.`,
      '',
    ];
    for (const [name, scriptSql] of Object.entries(SCRIPTS)) {
      for (const mode of ['prepared', 'simple'] as const) {
        for (const path of ['direct', 'endpoint'] as const) {
          const o: PgbenchOptions = {
            url: path === 'direct' ? db.url : endpoint.toString(),
            scriptSql,
            clients: 16,
            mode,
            durationS: 1,
            ...(path === 'endpoint' ? { env } : {}),
          };
          await runPgbench(o); // warm-up
          await sql.query('SELECT pg_stat_statements_reset()');
          const r = await runPgbench({ ...o, durationS });
          const { rows } = await sql.query<StatementRow>(
            `SELECT calls::text, total_exec_time AS total_ms, toplevel, regexp_replace(query, '\\s+', ' ', 'g') AS query
             FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT ${TOP}`,
          );
          const tx = r.transactions;
          const top = rows.filter((s) => s.toplevel).reduce((a, s) => a + s.total_ms, 0);
          out.push(
            `### ${name}, -M ${mode}, ${path}: ${Math.round(r.tps)} tx/s, top-level statements ${((1000 * top) / Math.max(1, tx)).toFixed(1)} µs per transaction`,
            '',
          );
          out.push('| calls per tx | µs per tx | share | statement |', '|---:|---:|---:|---|');
          for (const s of rows) {
            const perTx = (1000 * s.total_ms) / Math.max(1, tx);
            if (perTx < 0.5) continue;
            out.push(
              `| ${(Number(s.calls) / Math.max(1, tx)).toFixed(2)} | ${perTx.toFixed(1)} | ${((100 * s.total_ms) / Math.max(1e-9, top)).toFixed(0)} % | ${s.toplevel ? '' : '↳ '}\`${s.query.slice(0, 110).replace(/\|/g, '\\|')}\` |`,
            );
          }
          out.push('');
        }
      }
    }
    process.stdout.write(out.join('\n') + '\n');
  } finally {
    await proxy?.stop();
    await sql.end();
    await db.stop();
    await dropBenchRole(clientRole);
  }
}

await main();
