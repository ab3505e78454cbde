// Issue 26's memory goal: the proxy's RSS stays flat (± 10 MB) under steady load on each door. One
// Postgres, and a fresh `fencepost serve` (HTTP and the SQL endpoint) for each door, loaded in turn for
// BENCH_SOAK_S seconds (default 20; the goal is stated for 300) after a warm-up of a tenth of that
// (1 to 30 s: the heap grows to its working size first), its RSS read
// from /proc every second: at the start of the soak, at its end, the highest.
//
//   objects       wrk PUT /v1/objects, 5,000 objects under one fence key, 32 connections
//   transactions  wrk POST /v1/transactions, one fence, one UPDATE, 16 connections
//   sql           pgbench -M prepared through the SQL endpoint, BEGIN; UPDATE; COMMIT, 16 clients
//
// `node --import tsx bench/soak.ts [objects|transactions|sql…]` runs some doors (default all).
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import { spawnServe, type ServeProcess } from './serve.ts';
import { benchPostgres, dropBenchRole, fmt, machine } from './support.ts';
import { luaString, runPgbench, runWrk } from './loadgen.ts';

export const SOAK_DOORS = ['objects', 'transactions', 'sql'] as const;
export type SoakDoor = (typeof SOAK_DOORS)[number];

export interface SoakRow {
  door: SoakDoor;
  seconds: number;
  /** Operations per second over the soak, and the failed ones (non-2xx, socket errors, failed transactions). */
  perS: number;
  failed: number;
  /** RSS (bytes) at the soak's first and last sample, the lowest and the highest sample. */
  startRss: number;
  endRss: number;
  minRss: number;
  maxRss: number;
  /**
   * The least-squares line through every sample, from the first sample to the last (bytes): growth,
   * not one sample's place in the heap's swing.
   */
  fittedRss: number;
  samples: number;
}

export interface SoakOptions {
  seconds: number;
  doors?: readonly SoakDoor[];
  log?: (line: string) => void;
}

/** A tenth of the soak, 1 to 30 s: long enough for the heap to reach its working size. */
export function warmUpSeconds(soakS: number): number {
  return Math.min(30, Math.max(1, Math.round(soakS / 10)));
}

/** The rise of the least-squares line through `samples` (one per second) from the first to the last. */
export function fittedChange(samples: readonly number[]): number {
  const n = samples.length;
  if (n < 2) return 0;
  const meanX = (n - 1) / 2;
  const meanY = samples.reduce((a, b) => a + b, 0) / n;
  let sxy = 0;
  let sxx = 0;
  samples.forEach((y, x) => {
    sxy += (x - meanX) * (y - meanY);
    sxx += (x - meanX) ** 2;
  });
  return (sxy / sxx) * (n - 1);
}

/** RSS flat within this many bytes over the soak (end − start). */
export const SOAK_GOAL_BYTES = 10 * 2 ** 20;
const ROWS = 5000;
const FENCE_KEY = 'bench-soak';
const DOOR_NAMES: Record<SoakDoor, string> = {
  objects: 'HTTP PUT /v1/objects, one fence key, 32 connections (wrk)',
  transactions: 'HTTP POST /v1/transactions, one UPDATE, 16 connections (wrk)',
  sql: 'SQL endpoint, BEGIN; UPDATE; COMMIT, 16 clients (pgbench -M prepared)',
};

/** Samples `proxy`'s RSS every second while `load` runs. */
async function sampled<T>(proxy: ServeProcess, load: () => Promise<T>): Promise<{ result: T; rss: number[] }> {
  const rss = [proxy.rss()];
  const timer = setInterval(() => rss.push(proxy.rss()), 1000);
  try {
    const result = await load();
    rss.push(proxy.rss());
    return { result, rss };
  } finally {
    clearInterval(timer);
  }
}

export async function runSoakBench(options: SoakOptions): Promise<SoakRow[]> {
  const o = { doors: SOAK_DOORS, log: () => {}, ...options };
  const db = await benchPostgres('fencepost_bench_soak');
  const clientRole = `fpbench_soak_${process.pid}`;
  const sql = new pg.Pool({ connectionString: db.url, max: 2 });
  sql.on('error', () => {});
  let proxy: ServeProcess | null = null;
  const rows: SoakRow[] = [];
  try {
    await migrate(sql);
    await sql.query('CREATE SCHEMA app');
    await sql.query('CREATE TABLE app.counters (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)');
    await sql.query('INSERT INTO app.counters (id) SELECT generate_series(1, $1)', [ROWS]);
    await sql.query(
      `INSERT INTO fencepost.objects (key, fence_key, token, version, content_type, body)
       SELECT 'soak/' || n, $1, 1, 1, 'application/json', convert_to(repeat('x', 256), 'UTF8') FROM generate_series(0, $2 - 1) n`,
      [FENCE_KEY, ROWS],
    );
    const serve = async () => {
      const started = await spawnServe(
        { DATABASE_URL: db.url, FENCEPOST_CLIENT_ROLE: clientRole, FENCEPOST_PGWIRE_MAX_CONNECTIONS: '200' },
        'strict',
        { pgwire: true },
      );
      return { port: started.pgwirePort!, proxy: started };
    };
    let pgwirePort: number;
    ({ port: pgwirePort, proxy } = await serve());
    const role = pg.escapeIdentifier(clientRole);
    await sql.query(`GRANT USAGE ON SCHEMA app TO ${role}`);
    await sql.query(`GRANT SELECT, UPDATE ON app.counters TO ${role}`);
    const fence = await fetch(`${proxy.url}/v1/fences/${FENCE_KEY}`, { method: 'PUT', headers: { 'fencing-token': '1' } });
    if (!fence.ok) throw new Error(`PUT /v1/fences/${FENCE_KEY} answered ${fence.status}: ${await fence.text()}`);
    const endpointUrl = new URL(db.url);
    endpointUrl.username = 'bench-leader';
    endpointUrl.password = '';
    endpointUrl.port = String(pgwirePort);
    const [head, tail] = [
      `{"fences":[{"key":"${FENCE_KEY}","token":"1"}],"statements":[{"sql":"UPDATE app.counters SET n = n + 1 WHERE id = $1","params":[`,
      ']}]}',
    ];
    const loads: Record<SoakDoor, (durationS: number) => Promise<{ ops: number; failed: number }>> = {
      objects: async (durationS) => {
        const r = await runWrk({
          url: proxy!.url,
          method: 'PUT',
          path: { lua: `"/v1/objects/soak%2F" .. math.random(0, ${ROWS - 1})` },
          headers: { 'Content-Type': 'application/json', 'Fence-Key': FENCE_KEY, 'Fencing-Token': '1' },
          body: `{"payload":"${'x'.repeat(242)}"}`,
          connections: 32,
          durationS,
        });
        return { ops: r.requests, failed: r.non2xx + r.errors };
      },
      transactions: async (durationS) => {
        const r = await runWrk({
          url: proxy!.url,
          method: 'POST',
          path: '/v1/transactions',
          headers: { 'Content-Type': 'application/json' },
          body: { lua: `${luaString(head)} .. math.random(1, ${ROWS}) .. ${luaString(tail)}` },
          connections: 16,
          durationS,
        });
        return { ops: r.requests, failed: r.non2xx + r.errors };
      },
      sql: async (durationS) => {
        const r = await runPgbench({
          url: endpointUrl.toString(),
          scriptSql: `\\set id random(1, ${ROWS})\nBEGIN;\nUPDATE app.counters SET n = n + 1 WHERE id = :id;\nCOMMIT;\n`,
          clients: 16,
          mode: 'prepared',
          durationS,
          env: { PGOPTIONS: `-c fencepost.token=1 -c fencepost.fence_key=${FENCE_KEY}` },
        });
        return { ops: r.transactions, failed: r.failed };
      },
    };
    for (const [i, door] of SOAK_DOORS.filter((d) => o.doors.includes(d)).entries()) {
      o.log(`soak: ${DOOR_NAMES[door]}, ${o.seconds} s, proxy RSS every second`);
      if (i > 0) {
        // A fresh proxy per door: what the previous door's load left in the heap (and V8 gives back
        // later) is not this door's.
        await proxy.stop();
        ({ port: pgwirePort, proxy } = await serve());
        endpointUrl.port = String(pgwirePort);
      }
      // Warm-up: V8's heap grows to its working size in the first seconds of load (from about 24 to
      // 57 MiB on the HTTP door); measured from there, the soak shows growth, not that.
      await loads[door](warmUpSeconds(o.seconds));
      const t = performance.now();
      const { result, rss } = await sampled(proxy, () => loads[door](o.seconds));
      const seconds = (performance.now() - t) / 1000;
      rows.push({
        door,
        seconds,
        perS: result.ops / seconds,
        failed: result.failed,
        startRss: rss[0]!,
        endRss: rss.at(-1)!,
        minRss: Math.min(...rss),
        maxRss: Math.max(...rss),
        fittedRss: fittedChange(rss),
        samples: rss.length,
      });
    }
    return rows;
  } finally {
    await proxy?.stop();
    await sql.end();
    await db.stop();
    await dropBenchRole(clientRole);
  }
}

const mib = (bytes: number, digits = 0) => fmt(bytes / 2 ** 20, digits);

export function soakTable(rows: readonly SoakRow[]): string {
  if (rows.length === 0) return '';
  const out = [
    `Proxy memory under steady load: a fresh \`fencepost serve\` (HTTP and the SQL endpoint) for each door, on one Postgres, each door in turn after a warm-up of a tenth of the soak (1 to 30 s), its RSS (/proc VmRSS) read every second; goal: end − start within ± ${mib(SOAK_GOAL_BYTES)} MiB (issue 26 states it over 300 s: BENCH_SOAK_S=300). Fitted: the rise of the least-squares line through every sample over the soak, which one sample's place in the heap's swing does not move.`,
    '',
    '| door | seconds | op/s | RSS start MiB | RSS end MiB | RSS min / max MiB | end − start MiB | goal | fitted MiB | samples | failed |',
    '|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|',
  ];
  for (const r of rows) {
    const delta = r.endRss - r.startRss;
    out.push(
      `| ${DOOR_NAMES[r.door]} | ${fmt(r.seconds, 0)} | ${fmt(r.perS, 0)} | ${mib(r.startRss)} | ${mib(r.endRss)} | ${mib(r.minRss)} / ${mib(r.maxRss)} | ${delta > 0 ? '+' : ''}${mib(delta, 1)} | ± ${mib(SOAK_GOAL_BYTES)}: ${Math.abs(delta) <= SOAK_GOAL_BYTES ? 'yes' : '**no**'} | ${r.fittedRss > 0 ? '+' : ''}${mib(r.fittedRss, 1)} | ${r.samples} | ${r.failed} |`,
    );
  }
  return out.join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const asked = process.argv.slice(2);
  const unknown = asked.filter((a) => !(SOAK_DOORS as readonly string[]).includes(a));
  if (unknown.length > 0) {
    process.stderr.write(`unknown door ${unknown.join(', ')}; choose from ${SOAK_DOORS.join(', ')}\n`);
    process.exit(2);
  }
  const rows = await runSoakBench({
    seconds: Number(process.env.BENCH_SOAK_S ?? 20),
    doors: asked.length > 0 ? (asked as SoakDoor[]) : SOAK_DOORS,
    log: (line) => process.stderr.write(`[bench] ${line}\n`),
  });
  process.stdout.write(`Measured on: ${machine()}; ${new Date().toISOString().slice(0, 10)}.\n\n${soakTable(rows)}\n`);
}
