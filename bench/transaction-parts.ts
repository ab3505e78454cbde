// Where Postgres spends a POST /v1/transactions transaction, part by part: pgbench replays the
// proxy's own three Queries (src/fence/queries.ts openClientTransaction, the writer's statement,
// sealAndCommit) straight to Postgres, with no proxy, then the same with one part taken away at a
// time. The difference between two rows is what that part costs Postgres, in CPU from /proc.
//
// Rows, each a pgbench script of three Queries (-M simple, 16 clients, one fence key at token 1):
//   proxy                 the Queries as the proxy sends them (fence_transaction_bound's capability
//                         computed in SQL for the backend, the seal given txid_current())
//   share step as …       copies of fence_transaction_bound whose share step (INSERT … FOR SHARE of
//                         the fence row, rule.ts leaderFastPath) is a shared advisory lock and the
//                         count row, the count row alone, or a plain read of the fence row
//   SELECT 1 for fence    the open Query with SELECT 1 in the fence call's place
//   … no session reset    that, without the reset transaction (session-reset.ts)
//   … no seal             that, with a plain COMMIT for the seal Query
//   direct                BEGIN; UPDATE; COMMIT
// Rounds alternate the rows (the order turns each round), each window after CHECKPOINT and sync:
// this box's speed drifts by half within minutes, so compare rows of one round, and medians.
// It runs as the superuser (no SET LOCAL ROLE) and the UPDATE goes as a simple Query (the proxy
// sends it extended).
//
// `BENCH_DURATION_S=5 BENCH_ROUNDS=5 node --import tsx bench/transaction-parts.ts` (pgbench: scripts/setup.sh --bench).
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import * as q from '../src/fence/queries.ts';
import { RESET_SESSION } from '../src/fence/session-reset.ts';
import { boundCapabilitySql, CAPABILITY_SECRET_SQL } from '../src/fence/rule.ts';
import { measureCpu, postmasterPid, treeProbe } from './cpu.ts';
import { runPgbench } from './loadgen.ts';
import { benchPostgres, fmt, machine, settleDisk } from './support.ts';
import { distribution } from '../src/election/advice.ts';

const ROWS = 5000;
const CLIENTS = 16;
const FENCE_KEY = 'bench-parts';
const UPDATE = `\\set id random(1, ${ROWS})\nUPDATE app.counters SET n = n + 1 WHERE id = :id;\n`;

/** One pgbench command from a Query of several statements (`\;` joins them into one Query). */
function oneQuery(sql: string): string {
  if (/'[^']*;[^']*'/.test(sql)) throw new Error('a semicolon inside a literal would split the Query');
  return `${sql.trim().replace(/;\s*$/, '').replace(/;/g, '\\;')};\n`;
}

/** The proxy's open Query, its capability computed in SQL (pgbench cannot hash per backend). */
function openQuery(): string {
  const args = q.boundFenceArgs([{ fenceKey: FENCE_KEY, token: 1n }], null);
  const placeholder = 'a'.repeat(64);
  const text = q.openClientTransaction('read committed', 5000, 5000, null, { ...args, bound: placeholder }).text;
  const bound = boundCapabilitySql(CAPABILITY_SECRET_SQL, [`'${args.keysHex}'`, `'${args.tokens}'`, 'NULL']);
  if (!text.includes(`'${placeholder}'`)) throw new Error('openClientTransaction changed: no capability literal');
  return text.replace(`'${placeholder}'`, `(${bound})`);
}

/** The seal Query for whatever transaction it runs in. */
function sealQuery(): string {
  const text = q.sealAndCommit('0').text;
  if (!text.includes('seal_client_transaction(0)')) throw new Error('sealAndCommit changed');
  return text.replace('seal_client_transaction(0)', 'seal_client_transaction(txid_current())');
}

const SHARE_STEP = /INSERT INTO fencepost\.pending_counts \(fence_key\)\s+SELECT f\.fence_key FROM fencepost\.fences f WHERE (f\.fence_key = v_key AND f\.highest_token = tokens::bigint) FOR SHARE OF f;/;

/**
 * A copy of fence_transaction_bound named `name` whose share step (rule.ts leaderFastPath) is
 * `step`, plpgsql in which `$1` is the share step's condition on the fence row. For measuring only:
 * none of these copies is a fence.
 */
async function fenceVariant(sql: pg.Pool, name: string, step: string): Promise<string> {
  const def = (await sql.query<{ d: string }>(`SELECT pg_get_functiondef('fencepost.fence_transaction_bound(text,text,text,text)'::regprocedure) AS d`)).rows[0]!.d;
  if (!SHARE_STEP.test(def)) throw new Error('fence_transaction_bound changed: no share step to replace');
  await sql.query(def.replace('fencepost.fence_transaction_bound(', `fencepost.${name}(`).replace(SHARE_STEP, step));
  return name;
}

interface Row {
  id: string;
  name: string;
  script: string;
  tps: number[];
  pgUs: number[];
}

const median = (xs: readonly number[]) => distribution(xs).median;

async function main(): Promise<void> {
  const durationS = Number(process.env.BENCH_DURATION_S ?? 5);
  const rounds = Number(process.env.BENCH_ROUNDS ?? 5);
  const db = await benchPostgres('fencepost_bench_parts');
  const sql = new pg.Pool({ connectionString: db.url, max: 2 });
  sql.on('error', () => {});
  try {
    await migrate(sql);
    await sql.query('CREATE SCHEMA app; CREATE TABLE app.counters (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)');
    await sql.query('INSERT INTO app.counters (id) SELECT generate_series(1, $1)', [ROWS]);
    await sql.query('INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ($1, 1)', [FENCE_KEY]);
    const pm = await postmasterPid(db.url);
    if (pm === null) throw new Error('no postmaster pid');
    const open = openQuery();
    const call = /SELECT ord, highest_token, xact FROM fencepost\.fence_transaction_bound\([^)]*\)\)?[^;]*$/;
    if (!call.test(open)) throw new Error('openClientTransaction changed: the fence call is not last');
    const openSelect1 = open.replace(call, 'SELECT 1');
    if (!openSelect1.startsWith(RESET_SESSION)) throw new Error('openClientTransaction changed: it does not start with the reset');
    const seal = sealQuery();
    const withFence = async (name: string, step: string) => `${oneQuery(open.replace('fence_transaction_bound', await fenceVariant(sql, name, step)))}${UPDATE}${oneQuery(seal)}`;
    const countRow = 'INSERT INTO fencepost.pending_counts (fence_key) SELECT f.fence_key FROM fencepost.fences f WHERE $1;';
    const rows: Row[] = [
      { id: 'proxy', name: 'proxy: open Query with the fence, UPDATE, seal and COMMIT', script: `${oneQuery(open)}${UPDATE}${oneQuery(seal)}` },
      // Not a fence (a raise would not wait for it): what the lock costs, and what one in memory would.
      { id: 'advisory', name: 'the share step as a shared advisory lock, then the count row', script: await withFence('bench_fence_advisory', `PERFORM pg_catalog.pg_advisory_xact_lock_shared(0, pg_catalog.hashtext(v_key));\n    ${countRow}`) },
      { id: 'count', name: 'the share step without its lock (the count row only)', script: await withFence('bench_fence_count_only', countRow) },
      { id: 'read', name: 'the share step as a plain read (no lock, no count row)', script: await withFence('bench_fence_read_only', 'PERFORM FROM fencepost.fences f WHERE $1;') },
      { id: 'select1', name: '`SELECT 1` in the fence call\'s place', script: `${oneQuery(openSelect1)}${UPDATE}${oneQuery(seal)}` },
      { id: 'noReset', name: '… and no session reset', script: `${oneQuery(openSelect1.slice(RESET_SESSION.length))}${UPDATE}${oneQuery(seal)}` },
      { id: 'noSeal', name: '… and `COMMIT` for the seal Query', script: `${oneQuery(openSelect1.slice(RESET_SESSION.length))}${UPDATE}COMMIT;\n` },
      { id: 'direct', name: 'direct: `BEGIN; UPDATE; COMMIT`', script: `BEGIN;\n${UPDATE}COMMIT;\n` },
    ].map((r) => ({ ...r, tps: [], pgUs: [] }));
    for (let round = 0; round < rounds; round++) {
      for (let k = 0; k < rows.length; k++) {
        const row = rows[(k + round) % rows.length]!;
        const o = { url: db.url, scriptSql: row.script, clients: CLIENTS, mode: 'simple' as const };
        await runPgbench({ ...o, durationS: 1 }); // warm-up
        await sql.query(q.foldPendingCounts());
        await settleDisk(sql);
        const { result, cpu } = await measureCpu([treeProbe('postgres', pm)], () => runPgbench({ ...o, durationS }));
        if (result.failed > 0) throw new Error(`${row.name}: ${result.failed} transactions failed`);
        row.tps.push(result.tps);
        row.pgUs.push((cpu.us.postgres ?? NaN) / result.transactions);
        process.stderr.write(`[bench] round ${round + 1}/${rounds}: ${row.name}: ${Math.round(result.tps)} tx/s, Postgres ${fmt(row.pgUs.at(-1)!)} µs/tx\n`);
      }
    }
    const out = [
      `Measured on: ${machine()}; ${new Date().toISOString().slice(0, 10)}. pgbench -M simple, ${CLIENTS} clients, ${durationS} s per window after 1 s of warm-up, ${rounds} rounds alternating; Postgres CPU (utime + stime of the postmaster's tree) per transaction.`,
      '',
      '| script | tx/s (median) | Postgres µs/tx (median) | Postgres µs/tx by round | × direct |',
      '|---|---:|---:|---|---:|',
    ];
    const us = (id: string) => rows.find((r) => r.id === id)!.pgUs;
    const direct = median(us('direct'));
    for (const r of rows) out.push(`| ${r.name} | ${Math.round(median(r.tps))} | ${fmt(median(r.pgUs))} | ${r.pgUs.map((x) => fmt(x, 0)).join(', ')} | ${fmt(median(r.pgUs) / direct, 2)}× |`);
    // Each part: the median over rounds of the difference between neighbouring rows of that round.
    const part = (a: string, b: string) => fmt(median(us(a).map((x, k) => x - us(b)[k]!)));
    out.push(
      '',
      '| part | Postgres µs/tx (median of per-round differences) |',
      '|---|---:|',
      `| the share step's row lock (FOR SHARE) | ${part('proxy', 'count')} |`,
      `| a shared advisory lock in its place | ${part('advisory', 'count')} |`,
      `| the count row | ${part('count', 'read')} |`,
      `| the rest of fence_transaction_bound (capability, NO_PREPARE, mark, result) | ${part('read', 'select1')} |`,
      `| the session reset | ${part('select1', 'noReset')} |`,
      `| the seal Query in COMMIT's place | ${part('noReset', 'noSeal')} |`,
      `| BEGIN's modes and the SET LOCALs (with SELECT 1, against direct) | ${part('noSeal', 'direct')} |`,
      `| direct: BEGIN, UPDATE, COMMIT | ${fmt(direct)} |`,
    );
    process.stdout.write(out.join('\n') + '\n');
  } finally {
    await sql.end();
    await db.stop();
  }
}

await main();
