// Tenant B's leader: writes through the SQL endpoint, over HTTP (objects) and POST /v1/transactions,
// and raises its fence (a new token) every few writes, timing each operation. The same seed gives
// the same sequence of operations, so a solo run and a hostile run are comparable.
import type pg from 'pg';
import { Prng } from '../chaos/prng.ts';
import { fenceOptions, http, httpCode, sqlDoorClient, type Endpoints, type Tenant } from './tenants.ts';

export type VictimOp = 'sql-write' | 'http-write' | 'tx-write' | 'raise';

export interface VictimRun {
  /** Milliseconds per operation, by kind ('raise' apart from the writes). */
  writeMs: number[];
  raiseMs: number[];
  /** Every error B saw: operation and code. None is B's own in this workload (it never goes stale). */
  errors: { op: VictimOp; code: string; message: string }[];
  /** Writes that succeeded, by door: the database must show exactly these. */
  sqlRows: number;
  txRows: number;
  objects: Map<string, bigint>;
  /** B's token at the end (its fence's highest token must be this). */
  token: bigint;
}

export interface VictimOptions {
  seed: number;
  durationMs: number;
  /** Token to start at (each run raises from here; runs go on from the previous run's token). */
  startToken: bigint;
  /** Objects and rows are tagged with this, so runs share a database without mixing. */
  runTag: string;
}

/** Nearest-rank percentile (p in 0…100) of `xs`; 0 for none. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return 0;
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

function pgCode(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown };
  return typeof e.code === 'string' ? e.code : String(e.message ?? err);
}

/**
 * Runs B's leader for `durationMs`: a seeded sequence of writes on the three doors, with a raise
 * (PUT /v1/fences at token+1, which ends the SQL connection at the old token; the leader connects
 * at the new one) about every seventh operation. One operation at a time, as one leader.
 */
export async function runVictim(e: Endpoints, b: Tenant, o: VictimOptions): Promise<VictimRun> {
  const rng = new Prng(o.seed);
  let token = o.startToken;
  const run: VictimRun = { writeMs: [], raiseMs: [], errors: [], sqlRows: 0, txRows: 0, objects: new Map(), token };
  let sql: pg.Client | null = null;
  const session = async (): Promise<pg.Client> => {
    if (sql !== null) return sql;
    const c = sqlDoorClient(e, b, fenceOptions(token, b.fenceKey));
    await c.connect();
    sql = c;
    return c;
  };
  await session();
  const deadline = Date.now() + o.durationMs;
  let i = 0;
  try {
    while (Date.now() < deadline) {
      i++;
      const roll = rng.next();
      const op: VictimOp = i % 7 === 0 ? 'raise' : roll < 0.4 ? 'sql-write' : roll < 0.75 ? 'http-write' : 'tx-write';
      const started = performance.now();
      try {
        if (op === 'sql-write') {
          const c = await session();
          await c.query(`INSERT INTO ${b.table} (v) VALUES ($1)`, [`${o.runTag}:${i}`]);
          run.sqlRows++;
        } else if (op === 'http-write') {
          const key = `${b.prefix}${o.runTag}/obj-${rng.int(0, 9)}`;
          const r = await http(
            e,
            b,
            'PUT',
            `/v1/objects/${encodeURIComponent(key)}`,
            { 'fencing-token': String(token), 'fence-key': b.fenceKey, 'content-type': 'text/plain' },
            `${o.runTag}:${i}`,
          );
          if (r.status !== 200) throw Object.assign(new Error(r.text.slice(0, 200)), { code: httpCode(r) });
          run.objects.set(key, token);
        } else if (op === 'tx-write') {
          const body = JSON.stringify({
            fences: [{ key: b.fenceKey, token: String(token) }],
            statements: [{ sql: `INSERT INTO ${b.table} (v) VALUES ($1)`, params: [`${o.runTag}:tx:${i}`] }],
          });
          const r = await http(e, b, 'POST', '/v1/transactions', { 'content-type': 'application/json' }, body);
          if (r.status !== 200) throw Object.assign(new Error(r.text.slice(0, 200)), { code: httpCode(r) });
          run.txRows++;
        } else {
          const next = token + 1n;
          const r = await http(e, b, 'PUT', `/v1/fences/${encodeURIComponent(b.fenceKey)}`, { 'fencing-token': String(next) });
          if (r.status !== 200) throw Object.assign(new Error(r.text.slice(0, 200)), { code: httpCode(r) });
          token = next;
          run.token = token;
          // The raise ended the leader's SQL connection at the old token: it connects at the new one.
          const old = sql as pg.Client | null;
          sql = null;
          await old?.end().catch(() => {});
          await session();
        }
        (op === 'raise' ? run.raiseMs : run.writeMs).push(performance.now() - started);
      } catch (err) {
        const ms = performance.now() - started;
        (op === 'raise' ? run.raiseMs : run.writeMs).push(ms);
        run.errors.push({ op, code: pgCode(err), message: (err as Error).message });
        // A session that failed may be gone (a 57P01, an 08006): the leader reconnects at its token.
        if (op !== 'http-write' && op !== 'tx-write' && sql !== null) {
          await (sql as pg.Client).end().catch(() => {});
          sql = null;
        }
      }
    }
  } finally {
    if (sql !== null) await (sql as pg.Client).end().catch(() => {});
  }
  return run;
}
