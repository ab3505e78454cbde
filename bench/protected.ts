// What protected data (src/fence/protect.ts) costs each door: the same write measured twice, back to
// back on one Postgres and one proxy, first with nothing protected, then with its data protected
// (the table's statement trigger refuse_unfenced_write, or the objects' row trigger
// refuse_misfenced_object under a protected prefix). The difference is the database's check.
// bench/fence-key.ts (HTTP objects, /v1/transactions) and bench/sql-endpoint.ts (pgbench through
// the endpoint) measure the pairs; this module checks that protection is in force before the
// protected run, reads the trigger's own time in Postgres (pg_stat_user_functions: the check
// without the noise of a shared box's throughput) and prints the pairs' table.
import type pg from 'pg';
import { NOT_FENCED } from '../src/fence/codes.ts';
import { sqlState } from '../src/fence/pg-errors.ts';
import { fmt } from './support.ts';
import type { PgbenchResult, WrkResult } from './loadgen.ts';

/** One measured run of a door's write. */
export interface Rate {
  /** Writes per second (HTTP requests or pgbench transactions, one write each). */
  perS: number;
  p50Ms: number;
  p99Ms: number;
  /** Non-2xx answers and socket errors (wrk), failed transactions (pgbench): must be 0. */
  failed: number;
}

export interface ProtectedPair {
  door: string;
  /** What was protected for the second run. */
  protection: string;
  inFlight: number;
  unprotected: Rate;
  protected: Rate;
  /** The trigger function over the protected run (pg_stat_user_functions, track_functions = pl). */
  inPostgres: TriggerTime | null;
}

export interface TriggerTime {
  /** fencepost.refuse_unfenced_write or fencepost.refuse_misfenced_object */
  fn: string;
  calls: number;
  usPerCall: number;
  /** Calls ÷ the run's writes (a statement trigger once per statement, the objects' row trigger per row and event). */
  callsPerWrite: number;
}

/**
 * Before a world's proxy connects: its database's sessions time plpgsql functions (both runs of a
 * pair, so the pair stays fair; the timing costs a function call well under a µs).
 */
export async function trackFunctions(sql: pg.Pool): Promise<void> {
  await sql.query(`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = pl', current_database()); END $$`);
}

/**
 * Calls of fencepost.`fn` and their total ms so far. Backends report at most once a second (an idle
 * one within 10 s), so a reading right after a run lacks up to a second of it; the reading before
 * it, taken right after the warm-up, lacks as much of the warm-up, which the delta then counts.
 */
export async function triggerCalls(sql: pg.Pool, fn: string): Promise<{ calls: number; ms: number }> {
  const { rows } = await sql.query<{ calls: number; ms: number }>(
    "SELECT coalesce(sum(calls), 0)::float8 AS calls, coalesce(sum(total_time), 0)::float8 AS ms FROM pg_stat_user_functions WHERE schemaname = 'fencepost' AND funcname = $1",
    [fn],
  );
  return rows[0]!;
}

export function triggerTime(
  fn: string,
  before: { calls: number; ms: number },
  after: { calls: number; ms: number },
  writes: number,
): TriggerTime | null {
  const calls = after.calls - before.calls;
  if (calls <= 0) return null;
  return { fn: `fencepost.${fn}`, calls, usPerCall: ((after.ms - before.ms) * 1000) / calls, callsPerWrite: calls / writes };
}

export const wrkRate = (r: WrkResult): Rate => ({ perS: r.rps, p50Ms: r.p50Ms, p99Ms: r.p99Ms, failed: r.non2xx + r.errors });
export const pgbenchRate = (r: PgbenchResult): Rate => ({ perS: r.tps, p50Ms: r.p50Ms, p99Ms: r.p99Ms, failed: r.failed });

/**
 * Before a protected run: `text`, sent straight to Postgres on the bench's own (superuser) pool, must
 * fail with FP403, or the "protected" figure would measure an unprotected write.
 */
export async function expectRefused(sql: pg.Pool, text: string): Promise<void> {
  try {
    await sql.query(text);
  } catch (err) {
    if (sqlState(err) === NOT_FENCED) return;
    throw new Error(`expected ${NOT_FENCED} (protected data) from ${JSON.stringify(text)}`, { cause: err });
  }
  throw new Error(`${JSON.stringify(text)} was accepted: the data is not protected, a protected run would measure nothing`);
}

/**
 * The cost of the check per write, from each run's figures: the time per write at the measured
 * throughput (1 / rate: what a write costs the box, all `inFlight` in flight sharing it), and the
 * latency one write sees (p50, p99).
 */
export function checkCost(p: ProtectedPair): { perWriteUs: number; p50Us: number; p99Us: number; ratio: number } {
  return {
    perWriteUs: 1e6 / p.protected.perS - 1e6 / p.unprotected.perS,
    p50Us: (p.protected.p50Ms - p.unprotected.p50Ms) * 1000,
    p99Us: (p.protected.p99Ms - p.unprotected.p99Ms) * 1000,
    ratio: p.protected.perS / p.unprotected.perS,
  };
}

const signed = (n: number, digits = 0) => (n > 0 ? `+${fmt(n, digits)}` : fmt(n, digits));

export function protectedTable(pairs: readonly ProtectedPair[], durationS: number): string {
  if (pairs.length === 0) return '';
  const out = [
    `Cost of the database check (protected data): each door's write measured twice back to back on one Postgres and one proxy, nothing protected, then its data protected (\`fencepost protect\`); ${durationS} s each after 1 s of warm-up. µs per write from throughput = 1/protected − 1/unprotected (the box's time per write, all in flight sharing it); the latency deltas are what one write waits longer. Differences of a few percent are within this box's run-to-run noise.`,
    '',
    '| door | protected | in flight | writes/s unprotected / protected | ratio | p50 ms unprotected / protected | p99 ms unprotected / protected | cost of the database check: µs per write (throughput) | p50 / p99 Δ µs | in Postgres: trigger µs per call × calls per write | failed |',
    '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const p of pairs) {
    const c = checkCost(p);
    const [u, x] = [p.unprotected, p.protected];
    const t = p.inPostgres;
    const inPg = t === null ? '–' : `${fmt(t.usPerCall, 1)} × ${fmt(t.callsPerWrite, 2)} = ${fmt(t.usPerCall * t.callsPerWrite, 1)}`;
    out.push(
      `| ${p.door} | ${p.protection} | ${p.inFlight} | ${fmt(u.perS, 0)} / ${fmt(x.perS, 0)} | ${fmt(c.ratio, 3)}× | ${fmt(u.p50Ms, 2)} / ${fmt(x.p50Ms, 2)} | ${fmt(u.p99Ms, 2)} / ${fmt(x.p99Ms, 2)} | ${signed(c.perWriteUs, 1)} | ${signed(c.p50Us)} / ${signed(c.p99Us)} | ${inPg} | ${u.failed} / ${x.failed} |`,
    );
  }
  const fns = [...new Set(pairs.flatMap((p) => (p.inPostgres ? [p.inPostgres.fn] : [])))];
  if (fns.length > 0) {
    out.push(
      '',
      `In Postgres: the trigger function's own time (${fns.map((f) => `\`${f}\``).join(', ')}) from \`pg_stat_user_functions\` over the protected run (the bench database runs with \`track_functions = pl\`, both runs of each pair); calls per write counted from the same view, to within a second of reporting lag.`,
    );
  }
  return out.join('\n');
}
