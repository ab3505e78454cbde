// Issue 11, "a leader's writes under one fence key at database speed": the pattern users follow
// (one leader, one fence key, many objects), measured with C load generators (bench/loadgen.ts):
// wrk against a `fencepost serve` process, pgbench -M prepared sending the same statement straight
// to the same Postgres. Each scenario gets a fresh Postgres, migrated, and a proxy of its own.
// Every measured run also reads CPU per operation of Postgres, the proxy and wrk or pgbench
// (bench/cpu.ts), and the door scenarios run once more with Postgres pinned to one core
// (bench/placement.ts, BENCH_PLACEMENT).
//
//   one-fence        PUT of 5,000 objects under one fence key and token, 32 in flight, vs the upsert
//   distinct-fences  PUT of 10,000 objects, each its own fence key, 32 in flight, vs the upsert
//   transactions     POST /v1/transactions (one fence, one UPDATE), 16 in flight, vs BEGIN/UPDATE/COMMIT
//   protected        the cost of the database check (bench/protected.ts): one-fence's PUTs run again
//                    with their prefix protected (bench/ → the fence key they name), transactions'
//                    POSTs with app.counters protected (→ bench-tx); each right after the unprotected
//                    proxy run, on the same Postgres and proxy. Alone, it runs those two worlds'
//                    proxy runs without the direct pgbench.
//   raise            a fence raise (token 2) while token-1 writes run: its latency, and any token-1
//                    write accepted though sent after the raise was acknowledged (must be none)
//   reads            the read API with 1,000,000 fences and 1,000,000 rejections in the tables,
//                    loaded on migration 0001's schema and carried forward by the later migrations
//
// `node --import tsx bench/fence-key.ts [scenario…]` runs some (default all) and prints their tables.
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import { protectPrefix, protectTable } from '../src/fence/protect.ts';
import { distribution, type Distribution } from '../src/election/advice.ts';
import { spawnServe, type ServeProcess } from './serve.ts';
import { benchPostgres, dropBenchRole, fmt, jsonBody, machine, settleDisk } from './support.ts';
import { loadGeneratorVersions, luaString, runPgbench, runWrk, type PgbenchResult, type WrkOptions, type WrkResult } from './loadgen.ts';
import { expectRefused, protectedTable, trackFunctions, triggerCalls, triggerTime, wrkRate, type ProtectedPair } from './protected.ts';
import {
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

export const SCENARIOS = ['one-fence', 'distinct-fences', 'transactions', 'protected', 'raise', 'reads'] as const;
export type Scenario = (typeof SCENARIOS)[number];

export interface FenceKeyBenchOptions {
  /** Seconds of measured load per path (wrk and pgbench each). */
  durationS: number;
  /** Seconds of unmeasured load before each measured run (JIT, pools, prepared statements). */
  warmupS?: number;
  scenarios?: readonly Scenario[];
  /** Rows of fences and of rejections for `reads` (1,000,000). */
  tableRows?: number;
  log?: (line: string) => void;
}

/** The proxy against direct Postgres, same statement, same concurrency, same database. */
export interface Comparison {
  name: string;
  inFlight: number;
  proxy: WrkResult;
  direct: PgbenchResult;
  /** proxy req/s ÷ direct tx/s at least this. */
  goalRatio: number;
  /** proxy p99 ÷ direct p99 at most this (when the scenario sets one). */
  goalP99Ratio?: number;
  /** Issue 26's goals on CPU per operation (the CPU table). */
  cpuGoals?: readonly CpuGoal[];
  placement: Placement;
  /** CPU over each measured run: Postgres, the proxy (its run only) and wrk or pgbench. */
  proxyCpu: CpuWindow;
  directCpu: CpuWindow;
  /**
   * pgbench ran at the proxy's rate (pgbench -R): CPU per operation compared at equal rate, where
   * the work decides it, not how many operations share a WAL flush or a wakeup. Not a throughput row.
   */
  equalRate?: boolean;
}

export interface RaiseResult {
  writers: number;
  raiseStatus: number;
  raiseMs: number;
  /** Token-1 writes acknowledged before the raise was sent: their latency. */
  before: Distribution;
  writes: number;
  accepted: number;
  rejected: number;
  /** Neither 200 nor 409 (0 = no answer). */
  other: Record<string, number>;
  /** 200s for token-1 writes sent after the raise's 200 arrived: stale writes accepted. Must be 0. */
  staleAccepted: number;
  /** 200s for token-1 writes sent before the raise's 200 arrived but answered after it (committed first: fine). */
  overlapping: number;
  /** Token-1 writes sent after the raise's 200 arrived, and of them the 409s. */
  sentAfter: number;
  rejectedAfter: number;
}

export interface ReadTiming {
  path: string;
  ms: Distribution;
  /** Any status other than 200 seen. */
  badStatus: number | null;
}

export interface ReadsResult {
  rows: number;
  loadS: number;
  /** The migrations after the loader's schema, run over the loaded rows (an upgrade). */
  upgrade: { migrations: string[]; seconds: number };
  reads: ReadTiming[];
}

export interface FenceKeyReport {
  /** Every placement's (the main table shows the shared ones, the CPU table all). */
  comparisons: Comparison[];
  /** Runs measured beside the comparisons: the protected runs. */
  cpu: CpuRow[];
  /** The `protected` scenario: each door's write unprotected and protected, back to back. */
  protected: ProtectedPair[];
  raise: RaiseResult | null;
  reads: ReadsResult | null;
}

const READ_GOAL_MS = 20;
/** Issue 26: a fenced object write costs Postgres at most 0.4× a lone direct upsert, the proxy at most 35 µs. */
const HTTP_OBJECT_CPU_GOALS: readonly CpuGoal[] = [
  { part: 'postgres', maxRatio: 0.4 },
  { part: 'proxy', maxUs: 35 },
];
const CLIENT_ROLE_PREFIX = 'fpbench';

/** The direct upsert: the statement of a fenced PUT minus the fence, as pgbench sends it. */
function upsertScript(keyPrefix: string, keySpace: number, fenceKey: string | null): string {
  const key = `'${keyPrefix}' || :n`;
  return `\\set n random(0, ${keySpace - 1})
INSERT INTO fencepost.objects AS o (key, fence_key, token, version, content_type, body)
  VALUES (${key}, ${fenceKey === null ? key : `'${fenceKey}'`}, 1, 1, 'application/json', convert_to(repeat('x', 256), 'UTF8'))
  ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, version = o.version + 1, body = EXCLUDED.body, updated_at = now();
`;
}

// ---- one scenario's world: a Postgres, migrated, seeded, and a proxy ------------------------------

interface World {
  dbUrl: string;
  sql: pg.Pool;
  proxy: ServeProcess;
  /** The open-mode login client SQL runs as (FENCEPOST_CLIENT_ROLE). */
  clientRole: string;
  /** Postgres's postmaster (bench/cpu.ts); null: a server not on this machine. */
  postmaster: number | null;
  /** Migrations applied after the seed, over its rows, and how long they took. */
  upgrade: { migrations: string[]; seconds: number };
}

interface Seed {
  /**
   * Seed on the schema of migrations 1…this (the schema the seed's SQL was written for); the later
   * migrations then run over the seeded rows, as they would upgrade a live database. Default: all.
   */
  atMigration?: number;
  run(sql: pg.Pool): Promise<void>;
}

/** Migrations 1…`last`, with the definitions as they made them (the schema of that version). */
async function migrateUpTo(sql: pg.Pool, last: number): Promise<void> {
  await migrate(sql, { upTo: last });
}

/**
 * A fresh database for `name`, migrated and seeded (before the proxy starts), and a `fencepost
 * serve` on it. The client login gets a name of the bench's own: roles are cluster-wide, and on a
 * shared DATABASE_URL server a login made for another database would be refused.
 */
async function withWorld<T>(name: Scenario, seed: Seed, body: (w: World) => Promise<T>): Promise<T> {
  const db = await benchPostgres(`fencepost_bench_${name.replace(/-/g, '_')}`);
  const clientRole = `${CLIENT_ROLE_PREFIX}_${name.replace(/-/g, '_')}_${process.pid}`;
  const sql = new pg.Pool({ connectionString: db.url, max: 2 });
  sql.on('error', () => {}); // an idle connection cut at the end (DROP DATABASE … FORCE) is no failure
  let proxy: ServeProcess | null = null;
  try {
    if (seed.atMigration === undefined) await migrate(sql);
    else await migrateUpTo(sql, seed.atMigration);
    await seed.run(sql);
    const t = performance.now();
    const migrations = await migrate(sql);
    const upgrade = { migrations, seconds: (performance.now() - t) / 1000 };
    proxy = await spawnServe({ DATABASE_URL: db.url, FENCEPOST_CLIENT_ROLE: clientRole, ...extraEnv() });
    return await body({ dbUrl: db.url, sql, proxy, clientRole, upgrade, postmaster: await postmasterPid(db.url) });
  } finally {
    await proxy?.stop();
    await sql.end();
    await db.stop();
    await dropBenchRole(clientRole);
  }
}

/** One request that must succeed before load is put on a path (a broken path would measure errors). */
async function probe(url: string, init: RequestInit): Promise<void> {
  const r = await fetch(url, init);
  const text = await r.text();
  if (!r.ok) throw new Error(`${init.method ?? 'GET'} ${url} answered ${r.status}: ${text}`);
}

/** What a door scenario measures: the comparison with direct Postgres, the protected variant, or both. */
interface DoorParts {
  direct: boolean;
  protected: boolean;
}

/** The data a door's write goes to, protected for its second proxy run (the `protected` scenario). */
interface Protection {
  door: string;
  protection: string;
  /** The trigger function that checks it (fencepost schema), timed over the protected run. */
  trigger: string;
  /** Protects the data, then checks it is in force (refused straight to Postgres, the door still writes). */
  apply(w: World): Promise<void>;
}

interface DoorResult {
  /** One per placement. */
  comparisons: Comparison[];
  protectedPair: ProtectedPair | null;
  /** The protected run's CPU. */
  protectedCpu: CpuRow | null;
}

/**
 * For each placement (pinned first): pgbench straight to Postgres (runs.direct), then wrk through
 * the proxy; with runs.protection, that protection applied and wrk once more, sharing the cores,
 * right after the shared run (each after its own warm-up; a protected prefix stays protected, and
 * would refuse the direct upsert). Every measured run reads its processes' CPU (bench/cpu.ts).
 */
async function compare(
  w: World,
  o: Required<Pick<FenceKeyBenchOptions, 'durationS' | 'warmupS'>>,
  spec: Omit<Comparison, 'proxy' | 'direct' | 'placement' | 'proxyCpu' | 'directCpu'> & {
    wrk: Omit<WrkOptions, 'url' | 'connections' | 'durationS'>;
    pgbench: string;
    /** After the shared runs, pgbench once more at the proxy's rate; the CPU goals are judged on that pair. */
    equalRateDirect?: boolean;
  },
  runs: { direct: boolean; protection: Protection | null },
  log: (line: string) => void,
): Promise<DoorResult> {
  const pgb = { url: w.dbUrl, scriptSql: spec.pgbench, clients: spec.inFlight, mode: 'prepared' as const };
  const wrk = { ...spec.wrk, url: w.proxy.url, connections: spec.inFlight };
  const placed = { postgres: w.postmaster, others: [w.proxy.pid] };
  const probes = (viaProxy: boolean): CpuProbe[] => [
    ...(w.postmaster === null ? [] : [treeProbe('postgres', w.postmaster)]),
    ...(viaProxy ? [treeProbe('proxy', w.proxy.pid)] : []),
    exitedChildrenProbe(),
  ];
  const runProxy = async (what: string, placement: Placement, afterWarmup: () => Promise<void> = async () => {}) => {
    log(`${spec.name}${what}: wrk, ${spec.inFlight} connections, ${o.durationS} s, ${placement}`);
    place(placement, placed);
    if (o.warmupS > 0) await runWrk({ ...wrk, durationS: o.warmupS });
    await afterWarmup();
    await settleDisk(w.sql);
    return measureCpu(probes(true), () => runWrk({ ...wrk, durationS: o.durationS }));
  };
  const { wrk: _w, pgbench: _p, equalRateDirect, ...spec0 } = spec;
  // With an equal-rate pair the CPU goals are judged there only.
  const { cpuGoals: _g, ...withoutGoals } = spec0;
  const rest: typeof spec0 = equalRateDirect ? withoutGoals : spec0;
  const comparisons: Comparison[] = [];
  let proxyShared: WrkResult | null = null;
  let proxySharedCpu: CpuWindow | null = null;
  try {
    // Without the direct run (the protected pair alone) only the shared run, the pair's first half.
    const order: Placement[] = runs.direct ? [...placements()].sort((a, b) => (a === 'pinned' ? -1 : b === 'pinned' ? 1 : 0)) : ['shared'];
    for (const placement of order) {
      let direct: { result: PgbenchResult; cpu: CpuWindow } | null = null;
      if (runs.direct) {
        log(`${spec.name}: pgbench -M prepared, ${spec.inFlight} clients, ${o.durationS} s, ${placement}`);
        place(placement, placed);
        if (o.warmupS > 0) await runPgbench({ ...pgb, durationS: o.warmupS });
        await settleDisk(w.sql);
        direct = await measureCpu(probes(false), () => runPgbench({ ...pgb, durationS: o.durationS }));
      }
      const proxy = await runProxy('', placement);
      if (placement === 'shared') [proxyShared, proxySharedCpu] = [proxy.result, proxy.cpu];
      if (direct !== null)
        comparisons.push({ ...rest, placement, proxy: proxy.result, direct: direct.result, proxyCpu: proxy.cpu, directCpu: direct.cpu });
    }
    if (equalRateDirect && runs.direct && proxyShared !== null && proxySharedCpu !== null) {
      const rate = Math.max(1, Math.floor(proxyShared.rps));
      log(`${spec.name}: pgbench -M prepared at the proxy's ${rate} tx/s, ${spec.inFlight} clients, ${o.durationS} s, shared`);
      place('shared', placed);
      if (o.warmupS > 0) await runPgbench({ ...pgb, durationS: o.warmupS, rate });
      await settleDisk(w.sql);
      const direct = await measureCpu(probes(false), () => runPgbench({ ...pgb, durationS: o.durationS, rate }));
      comparisons.push({
        ...spec0,
        name: `${spec.name}, direct at the proxy's rate (${rate} tx/s)`,
        placement: 'shared',
        proxy: proxyShared,
        direct: direct.result,
        proxyCpu: proxySharedCpu,
        directCpu: direct.cpu,
        equalRate: true,
      });
    }
  } finally {
    place('shared', placed);
  }
  let protectedPair: ProtectedPair | null = null;
  let protectedCpu: CpuRow | null = null;
  const p = runs.protection;
  if (p !== null && proxyShared !== null) {
    await p.apply(w);
    let before = { calls: 0, ms: 0 };
    const { result: protectedRun, cpu } = await runProxy(`, ${p.protection}`, 'shared', async () => {
      before = await triggerCalls(w.sql, p.trigger);
    });
    const inPostgres = triggerTime(p.trigger, before, await triggerCalls(w.sql, p.trigger), protectedRun.requests);
    protectedPair = {
      door: p.door,
      protection: p.protection,
      inFlight: spec.inFlight,
      unprotected: wrkRate(proxyShared),
      protected: wrkRate(protectedRun),
      inPostgres,
    };
    protectedCpu = {
      ...wrkCpuRow(spec.name, `proxy (wrk), ${p.protection}`, 'shared', protectedRun, cpu),
      ...(rest.cpuGoals ? { goals: rest.cpuGoals } : {}),
    };
  }
  return { comparisons, protectedPair, protectedCpu };
}

function wrkCpuRow(scenario: string, path: string, placement: Placement, r: WrkResult, cpu: CpuWindow): CpuRow {
  return {
    scenario,
    path,
    direct: false,
    placement,
    perS: r.rps,
    p50Ms: r.p50Ms,
    p99Ms: r.p99Ms,
    ops: r.requests,
    failed: r.non2xx + r.errors,
    cpu,
  };
}

/** The CPU table's rows: each comparison's direct and proxy runs, then the protected runs. */
export function fenceKeyCpuRows(r: FenceKeyReport): CpuRow[] {
  const rows = r.comparisons.flatMap((c): CpuRow[] => [
    {
      scenario: c.name,
      path: 'direct (pgbench -M prepared)',
      direct: true,
      placement: c.placement,
      perS: c.direct.tps,
      p50Ms: c.direct.p50Ms,
      p99Ms: c.direct.p99Ms,
      ops: c.direct.transactions,
      failed: c.direct.failed,
      cpu: c.directCpu,
    },
    { ...wrkCpuRow(c.name, 'proxy (wrk)', c.placement, c.proxy, c.proxyCpu), ...(c.cpuGoals ? { goals: c.cpuGoals } : {}) },
  ]);
  // A protected run after its scenario's shared rows (compared with their direct row).
  for (const p of r.cpu) {
    const at = rows.findLastIndex((x) => x.scenario === p.scenario && x.placement === p.placement);
    rows.splice(at < 0 ? rows.length : at + 1, 0, p);
  }
  return rows;
}

/** One request that must be answered `status` with error code `error`. */
async function probeRefused(url: string, init: RequestInit, status: number, error: string): Promise<void> {
  const r = await fetch(url, init);
  const text = await r.text();
  if (r.status !== status || !text.includes(`"error":"${error}"`))
    throw new Error(`${init.method ?? 'GET'} ${url} answered ${r.status} (expected ${status} ${error}): ${text}`);
}

// ---- 1. one fence key, one token, 5,000 objects --------------------------------------------------

/**
 * Objects bench/0 … bench/<keySpace − 1> under one fence key, written once with token 1: the load
 * then updates existing objects, as a leader rewriting its state does (on both sides).
 */
function leaderObjects(fenceKey: string, keySpace: number): Seed {
  return {
    run: async (sql) => {
      await sql.query(
        `INSERT INTO fencepost.objects (key, fence_key, token, version, content_type, body)
         SELECT 'bench/' || n, $1, 1, 1, 'application/json', convert_to(repeat('x', 256), 'UTF8') FROM generate_series(0, $2 - 1) n`,
        [fenceKey, keySpace],
      );
    },
  };
}

async function oneFence(
  o: Required<Pick<FenceKeyBenchOptions, 'durationS' | 'warmupS'>>,
  parts: DoorParts,
  log: (line: string) => void,
): Promise<DoorResult> {
  const keySpace = 5000;
  const fenceKey = 'bench-leader';
  const prefix = 'bench/';
  const protection: Protection = {
    door: 'HTTP PUT /v1/objects, one fence key',
    protection: `prefix ${prefix} (objects' row trigger)`,
    trigger: 'refuse_misfenced_object',
    apply: async (w) => {
      await protectPrefix(w.sql, prefix, fenceKey);
      await expectRefused(w.sql, `UPDATE fencepost.objects SET fence_key = 'bench-other' WHERE key = '${prefix}0'`);
      // A write naming another fence key: 403 not_fenced, from the proxy's copy of the prefixes, or
      // from Postgres when the copy predates the declaration (the proxy then reads it again at once).
      const url = `${w.proxy.url}/v1/objects/${encodeURIComponent(`${prefix}0`)}`;
      await probeRefused(
        url,
        { method: 'PUT', headers: { 'content-type': 'application/json', 'fence-key': 'bench-other', 'fencing-token': '1' }, body: '{}' },
        403,
        'not_fenced',
      );
      await probe(url, {
        method: 'PUT',
        headers: { 'content-type': 'application/json', 'fence-key': fenceKey, 'fencing-token': '1' },
        body: jsonBody(256),
      });
    },
  };
  const seed = leaderObjects(fenceKey, keySpace);
  const run = async (sql: pg.Pool) => {
    await seed.run(sql);
    if (parts.protected) await trackFunctions(sql);
  };
  return withWorld('one-fence', { run }, async (w) => {
    await probe(`${w.proxy.url}/v1/fences/${fenceKey}`, { method: 'PUT', headers: { 'fencing-token': '1' } }); // the leader's fence advance
    return compare(
      w,
      o,
      {
        name: `one fence key, one token, ${keySpace.toLocaleString('en')} objects`,
        inFlight: 32,
        goalRatio: 0.8,
        goalP99Ratio: 3,
        cpuGoals: HTTP_OBJECT_CPU_GOALS,
        wrk: {
          method: 'PUT',
          path: { lua: `"/v1/objects/bench%2F" .. math.random(0, ${keySpace - 1})` },
          headers: { 'Content-Type': 'application/json', 'Fence-Key': fenceKey, 'Fencing-Token': '1' },
          body: jsonBody(256),
        },
        pgbench: upsertScript(prefix, keySpace, fenceKey),
      },
      { direct: parts.direct, protection: parts.protected ? protection : null },
      log,
    );
  });
}

// ---- 2. distinct fence keys ----------------------------------------------------------------------

async function distinctFences(
  o: Required<Pick<FenceKeyBenchOptions, 'durationS' | 'warmupS'>>,
  log: (line: string) => void,
): Promise<Comparison[]> {
  const keySpace = 10_000;
  const seed = async (sql: pg.Pool) => {
    // Every object and its fence (fence key = object key) already written once.
    await sql.query(`INSERT INTO fencepost.fences (fence_key, highest_token) SELECT 'bench-d/' || n, 1 FROM generate_series(0, $1 - 1) n`, [
      keySpace,
    ]);
    await sql.query(
      `INSERT INTO fencepost.objects (key, fence_key, token, version, content_type, body)
       SELECT 'bench-d/' || n, 'bench-d/' || n, 1, 1, 'application/json', convert_to(repeat('x', 256), 'UTF8') FROM generate_series(0, $1 - 1) n`,
      [keySpace],
    );
  };
  return withWorld('distinct-fences', { run: seed }, async (w) => {
    const { comparisons } = await compare(
      w,
      o,
      {
        name: `distinct fence keys (fence key = object key), ${keySpace.toLocaleString('en')} objects`,
        inFlight: 32,
        goalRatio: 0.8,
        goalP99Ratio: 3,
        cpuGoals: HTTP_OBJECT_CPU_GOALS,
        wrk: {
          method: 'PUT',
          path: { lua: `"/v1/objects/bench-d%2F" .. math.random(0, ${keySpace - 1})` },
          headers: { 'Content-Type': 'application/json', 'Fencing-Token': '1' },
          body: jsonBody(256),
        },
        pgbench: upsertScript('bench-d/', keySpace, null),
      },
      { direct: true, protection: null },
      log,
    );
    return comparisons;
  });
}

// ---- 3. /v1/transactions, one fence, one UPDATE --------------------------------------------------

async function transactions(
  o: Required<Pick<FenceKeyBenchOptions, 'durationS' | 'warmupS'>>,
  parts: DoorParts,
  log: (line: string) => void,
): Promise<DoorResult> {
  const rows = 5000;
  const fenceKey = 'bench-tx';
  const seed = async (sql: pg.Pool) => {
    await sql.query('CREATE SCHEMA app');
    await sql.query('CREATE TABLE app.counters (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)');
    await sql.query('INSERT INTO app.counters (id) SELECT generate_series(1, $1)', [rows]);
    if (parts.protected) await trackFunctions(sql);
  };
  const [head, tail] = [
    `{"fences":[{"key":"${fenceKey}","token":"1"}],"statements":[{"sql":"UPDATE app.counters SET n = n + 1 WHERE id = $1","params":[`,
    ']}]}',
  ];
  const txInit = (id: number): RequestInit => ({
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: `${head}${id}${tail}`,
  });
  const protection: Protection = {
    door: 'HTTP POST /v1/transactions, one UPDATE',
    protection: 'table app.counters (statement trigger)',
    trigger: 'refuse_unfenced_write',
    apply: async (w) => {
      await protectTable(w.sql, 'app.counters', fenceKey);
      await expectRefused(w.sql, 'UPDATE app.counters SET n = n WHERE id = 1');
      await probe(`${w.proxy.url}/v1/transactions`, txInit(1));
    },
  };
  return withWorld('transactions', { run: seed }, async (w) => {
    // The proxy created its client login at start; client SQL may do what the operator grants it.
    const role = pg.escapeIdentifier(w.clientRole);
    await w.sql.query(`GRANT USAGE ON SCHEMA app TO ${role}`);
    await w.sql.query(`GRANT SELECT, UPDATE ON app.counters TO ${role}`);
    await probe(`${w.proxy.url}/v1/transactions`, txInit(1));
    return compare(
      w,
      o,
      {
        name: '/v1/transactions: one fence, one UPDATE',
        inFlight: 16,
        goalRatio: 0.4,
        cpuGoals: [{ part: 'postgres', maxRatio: 1.5 }],
        equalRateDirect: true,
        wrk: {
          method: 'POST',
          path: '/v1/transactions',
          headers: { 'Content-Type': 'application/json' },
          body: { lua: `${luaString(head)} .. math.random(1, ${rows}) .. ${luaString(tail)}` },
        },
        pgbench: `\\set id random(1, ${rows})\nBEGIN;\nUPDATE app.counters SET n = n + 1 WHERE id = :id;\nCOMMIT;\n`,
      },
      { direct: parts.direct, protection: parts.protected ? protection : null },
      log,
    );
  });
}

// ---- 4. a raise under load -----------------------------------------------------------------------

interface Sent {
  sentMs: number;
  ackMs: number;
  status: number;
}

/** One HTTP request on a keep-alive agent: its send and answer times (performance.now()) and status (0 = none). */
function timedRequest(agent: http.Agent, url: string, method: string, headers: Record<string, string>, body?: string): Promise<Sent> {
  return new Promise((resolve) => {
    const sentMs = performance.now();
    const req = http.request(url, { method, headers, agent }, (res) => {
      res.resume();
      res.once('end', () => resolve({ sentMs, ackMs: performance.now(), status: res.statusCode ?? 0 }));
      res.once('error', () => resolve({ sentMs, ackMs: performance.now(), status: 0 }));
    });
    req.once('error', () => resolve({ sentMs, ackMs: performance.now(), status: 0 }));
    req.end(body);
  });
}

/**
 * Token-1 writes from `writers` loops in this process for `durationS` (each request's send and
 * answer time kept: wrk cannot give them), a raise to token 2 halfway, then the check: no token-1
 * write sent after the raise's 200 arrived may have been accepted.
 */
async function raise(o: { durationS: number }, log: (line: string) => void): Promise<RaiseResult> {
  const keySpace = 5000;
  const writers = 32;
  const fenceKey = 'bench-leader';
  return withWorld('raise', leaderObjects(fenceKey, keySpace), async (w) => {
    await probe(`${w.proxy.url}/v1/fences/${fenceKey}`, { method: 'PUT', headers: { 'fencing-token': '1' } });
    log(`a raise under load: ${writers} token-1 writers for ${o.durationS} s, a raise to token 2 after ${o.durationS / 2} s`);
    const writeAgent = new http.Agent({ keepAlive: true, maxSockets: writers });
    const raiseAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const body = jsonBody(256);
    const headers = {
      'content-type': 'application/json',
      'fence-key': fenceKey,
      'fencing-token': '1',
      'content-length': String(Buffer.byteLength(body)),
    };
    try {
      await timedRequest(raiseAgent, `${w.proxy.url}/readyz`, 'GET', {}); // the new leader's connection, open already
      const start = performance.now();
      const until = start + o.durationS * 1000;
      const sent: Sent[] = [];
      const loop = async () => {
        while (performance.now() < until) {
          sent.push(
            await timedRequest(
              writeAgent,
              `${w.proxy.url}/v1/objects/bench%2F${Math.floor(Math.random() * keySpace)}`,
              'PUT',
              headers,
              body,
            ),
          );
        }
      };
      const raising = (async () => {
        await new Promise((r) => setTimeout(r, (o.durationS * 1000) / 2));
        return timedRequest(raiseAgent, `${w.proxy.url}/v1/fences/${fenceKey}`, 'PUT', { 'fencing-token': '2' });
      })();
      const [raised] = await Promise.all([raising, ...Array.from({ length: writers }, loop)]);
      const after = sent.filter((s) => s.sentMs > raised.ackMs);
      const other: Record<string, number> = {};
      for (const s of sent) if (s.status !== 200 && s.status !== 409) other[s.status] = (other[s.status] ?? 0) + 1;
      return {
        writers,
        raiseStatus: raised.status,
        raiseMs: raised.ackMs - raised.sentMs,
        before: distribution(sent.filter((s) => s.ackMs < raised.sentMs).map((s) => s.ackMs - s.sentMs)),
        writes: sent.length,
        accepted: sent.filter((s) => s.status === 200).length,
        rejected: sent.filter((s) => s.status === 409).length,
        other,
        staleAccepted: after.filter((s) => s.status === 200).length,
        overlapping: sent.filter((s) => s.status === 200 && s.sentMs <= raised.ackMs && s.ackMs > raised.ackMs).length,
        sentAfter: after.length,
        rejectedAfter: after.filter((s) => s.status === 409).length,
      };
    } finally {
      writeAgent.destroy();
      raiseAgent.destroy();
    }
  });
}

// ---- 5. reads as the tables grow -----------------------------------------------------------------

/**
 * The loader's schema: migrations 1…this. BULK_LOAD names only tables and columns of migration
 * 0001; the later migrations then run over the loaded rows as they would upgrade a live database
 * (0005, say, moves the counters into tables of their own), so the loader needs no change when
 * the schema does, as long as each migration carries existing data forward, which it must anyway.
 */
const BULK_LOAD_SCHEMA = 1;

/** Share of the fences that have rejections in the log. */
const REJECTED_FENCES_SHARE = 0.01;

/**
 * Fill the tables the read API scans, straight in SQL; $1 = rows of each.
 *
 * Rejections: over the last 7 days (just inside the default retention, so the pruner leaves them),
 * one in 20 within the last hour (a failover's burst), ids in time order as a live log has them,
 * on 1% of the fences (the ones whose leaders failed over with a zombie still writing), skewed
 * among those. Fences: every key, each with some accepted writes and its count of rejections,
 * created and last raised at times over the last 30 days.
 */
const BULK_LOAD: readonly string[] = [
  `INSERT INTO fencepost.rejections (fence_key, object_key, operation, token, highest_token, writer_id, rejected_at)
   SELECT 'bulk/' || lpad(k::text, 7, '0'),
          CASE WHEN op = 'fence' THEN NULL ELSE 'bulk/' || lpad(k::text, 7, '0') || '/obj-' || i % 1000 END,
          op, 1 + k % 97, 2 + k % 97, 'writer-' || i % 50, at
   FROM (
     SELECT i, floor(power(random(), 3) * ceil($1 * ${REJECTED_FENCES_SHARE}))::bigint AS k,
            (ARRAY['put', 'put', 'put', 'put', 'put', 'put', 'put', 'delete', 'fence', 'transaction'])[1 + i % 10] AS op,
            CASE WHEN i % 20 = 0 THEN now() - random() * interval '60 minutes'
                 ELSE now() - random() * (interval '7 days' - interval '10 minutes') END AS at
     FROM generate_series(1, $1) i
   ) s
   ORDER BY at`,
  `INSERT INTO fencepost.fences (fence_key, highest_token, accepted, rejected, created_at, updated_at)
   SELECT f.fence_key, 2 + f.i % 97, 1 + (f.i * 7919::bigint) % 1000, coalesce(r.n, 0), f.raised - random() * interval '30 days', f.raised
   FROM (SELECT i, 'bulk/' || lpad(i::text, 7, '0') AS fence_key, now() - random() * interval '30 days' AS raised
         FROM generate_series(0, $1 - 1) i) f
   LEFT JOIN (SELECT fence_key, count(*) AS n FROM fencepost.rejections GROUP BY fence_key) r USING (fence_key)`,
];

async function reads(o: { tableRows: number }, log: (line: string) => void): Promise<ReadsResult> {
  let loadS = 0;
  const seed: Seed = {
    atMigration: BULK_LOAD_SCHEMA,
    run: async (sql) => {
      log(`reads: loading ${o.tableRows.toLocaleString('en')} fences and as many rejections`);
      const t = performance.now();
      for (const text of BULK_LOAD) await sql.query(text, [o.tableRows]);
      loadS = (performance.now() - t) / 1000;
    },
  };
  const someFence = `bulk%2F${String(Math.floor(o.tableRows / 2)).padStart(7, '0')}`;
  const paths = [
    '/v1/stats',
    '/v1/rejections/histogram?minutes=60',
    '/v1/fences?limit=100',
    `/v1/fences/${someFence}`,
    '/v1/rejections?limit=100',
  ];
  return withWorld('reads', seed, async (w) => {
    // As autovacuum would have by the time the tables are this big: statistics and visibility map.
    await w.sql.query('VACUUM ANALYZE');
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const results: ReadTiming[] = [];
      for (const path of paths) {
        log(`reads: GET ${path}`);
        const ms: number[] = [];
        let badStatus: number | null = null;
        for (let i = 0; i < 22; i++) {
          const r = await timedRequest(agent, `${w.proxy.url}${path}`, 'GET', {});
          if (r.status !== 200) badStatus = r.status;
          if (i >= 2) ms.push(r.ackMs - r.sentMs); // two warm-ups
        }
        if (badStatus !== null) {
          const r = await fetch(`${w.proxy.url}${path}`);
          log(`reads: GET ${path} answered ${r.status}: ${(await r.text()).slice(0, 300)}`);
        }
        results.push({ path, ms: distribution(ms), badStatus });
      }
      return { rows: o.tableRows, loadS, upgrade: w.upgrade, reads: results };
    } finally {
      agent.destroy();
    }
  });
}

// ---- the report ----------------------------------------------------------------------------------

export async function runFenceKeyBench(options: FenceKeyBenchOptions): Promise<FenceKeyReport> {
  const o = { warmupS: 1, scenarios: SCENARIOS, tableRows: 1_000_000, log: () => {}, ...options };
  const want = (s: Scenario) => o.scenarios.includes(s);
  const report: FenceKeyReport = { comparisons: [], cpu: [], protected: [], raise: null, reads: null };
  const add = (r: DoorResult) => {
    report.comparisons.push(...r.comparisons);
    if (r.protectedCpu) report.cpu.push(r.protectedCpu);
    if (r.protectedPair) report.protected.push(r.protectedPair);
  };
  const parts = (s: Scenario): DoorParts => ({ direct: want(s), protected: want('protected') });
  if (want('one-fence') || want('protected')) add(await oneFence(o, parts('one-fence'), o.log));
  if (want('distinct-fences')) report.comparisons.push(...(await distinctFences(o, o.log)));
  if (want('transactions') || want('protected')) add(await transactions(o, parts('transactions'), o.log));
  if (want('raise')) report.raise = await raise({ durationS: Math.max(2, Math.min(o.durationS, 6)) }, o.log);
  if (want('reads')) report.reads = await reads(o, o.log);
  return report;
}

const met = (ok: boolean) => (ok ? 'yes' : '**no**');

function non2xx(r: WrkResult): string {
  const by = Object.entries(r.statuses).map(([s, n]) => `${n}×${s}`);
  return `${r.non2xx}${by.length > 0 ? ` (${by.join(', ')})` : ''}${r.errors > 0 ? `, ${r.errors} socket errors` : ''}`;
}

export function fenceKeyTables(r: FenceKeyReport, durationS: number): string {
  const out: string[] = [];
  const shared = r.comparisons.filter((c) => c.placement === 'shared' && !c.equalRate);
  if (shared.length > 0) {
    const v = loadGeneratorVersions();
    out.push(
      `Load from C programs, not the bench process: wrk ${v.wrk} (2 threads) against a \`fencepost serve\` process with default settings, pgbench ${v.pgbench} (\`-M prepared\`, 2 threads) sending the same statement straight to the same database; ${durationS} s each after 1 s of warm-up; a fresh Postgres per scenario; every process on every core (the CPU table has the pinned runs).`,
      '',
      '| scenario | in flight | proxy req/s | direct tx/s | ratio | goal | p50 ms proxy / direct | p99 ms proxy / direct | p99 ratio | goal | proxy non-2xx | direct failed |',
      '|---|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|',
    );
    for (const c of shared) {
      const ratio = c.proxy.rps / c.direct.tps;
      const p99 = c.proxy.p99Ms / c.direct.p99Ms;
      out.push(
        `| ${c.name} | ${c.inFlight} | ${fmt(c.proxy.rps, 0)} | ${fmt(c.direct.tps, 0)} | ${fmt(ratio, 2)}× | ≥ ${c.goalRatio}×: ${met(ratio >= c.goalRatio)} | ${fmt(c.proxy.p50Ms, 2)} / ${fmt(c.direct.p50Ms, 2)} | ${fmt(c.proxy.p99Ms, 2)} / ${fmt(c.direct.p99Ms, 2)} | ${fmt(p99, 1)}× | ${c.goalP99Ratio === undefined ? '' : `≤ ${c.goalP99Ratio}×: ${met(p99 <= c.goalP99Ratio)}`} | ${non2xx(c.proxy)} | ${c.direct.failed} |`,
      );
    }
  }
  if (r.raise) {
    const x = r.raise;
    const other = Object.entries(x.other).map(([s, n]) => `${n}×${s === '0' ? 'no answer' : s}`);
    if (out.length > 0) out.push('');
    out.push(
      `| a raise under load (${x.writers} token-1 writers in the bench process, one fence key) | value | goal |`,
      '|---|---:|---|',
      `| raise to token 2 (PUT /v1/fences), latency | ${fmt(x.raiseMs, 1)} ms (status ${x.raiseStatus}) | |`,
      `| token-1 writes before the raise: p50 / p99 | ${fmt(x.before.median, 1)} / ${fmt(x.before.p99, 1)} ms | |`,
      `| token-1 writes: all / 200 / 409 / other | ${x.writes} / ${x.accepted} / ${x.rejected} / ${other.length > 0 ? other.join(', ') : 0} | |`,
      `| token-1 writes sent before the raise's 200, answered 200 after it (committed first) | ${x.overlapping} | |`,
      `| token-1 writes sent after the raise's 200: all / 409 | ${x.sentAfter} / ${x.rejectedAfter} | all 409: ${met(x.sentAfter === x.rejectedAfter)} |`,
      `| **token-1 writes accepted though sent after the raise's 200** | ${x.staleAccepted} | 0: ${met(x.staleAccepted === 0)} |`,
    );
  }
  if (r.reads) {
    const n = r.reads.rows.toLocaleString('en');
    if (out.length > 0) out.push('');
    const up = r.reads.upgrade;
    const upgraded =
      up.migrations.length > 0
        ? `, then migrations ${up.migrations.map((m) => m.slice(0, 4)).join(', ')} over them in ${fmt(up.seconds, 0)} s`
        : '';
    out.push(
      `| read, ${n} fences and ${n} rejections on ${REJECTED_FENCES_SHARE * 100}% of them (loaded in ${fmt(r.reads.loadS, 0)} s${upgraded}), sequential | median ms | max ms | n | goal |`,
      '|---|---:|---:|---:|---|',
      ...r.reads.reads.map((t) => {
        const goal = t.badStatus === null ? `≤ ${READ_GOAL_MS}: ${met(t.ms.median <= READ_GOAL_MS)}` : `**no: status ${t.badStatus}**`;
        return `| GET ${t.path} | ${fmt(t.ms.median, 1)} | ${fmt(t.ms.max, 1)} | ${t.ms.samples} | ${goal} |`;
      }),
    );
  }
  return out.join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const asked = process.argv.slice(2);
  const unknown = asked.filter((a) => !(SCENARIOS as readonly string[]).includes(a));
  if (unknown.length > 0) {
    process.stderr.write(`unknown scenario ${unknown.join(', ')}; choose from ${SCENARIOS.join(', ')}\n`);
    process.exit(2);
  }
  const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
  const tableRows = Number(process.env.BENCH_TABLE_ROWS ?? 1_000_000);
  const report = await runFenceKeyBench({
    durationS,
    tableRows,
    scenarios: asked.length > 0 ? (asked as Scenario[]) : SCENARIOS,
    log: (line) => process.stderr.write(`[bench] ${line}\n`),
  });
  const tables = [
    fenceKeyTables(report, durationS),
    cpuTable(fenceKeyCpuRows(report), { pinnedCpus: pinnedDescription() }),
    protectedTable(report.protected, durationS),
  ].filter((t) => t !== '');
  process.stdout.write(`Measured on: ${machine()}; ${new Date().toISOString().slice(0, 10)}.\n\n${tables.join('\n\n')}\n`);
}

/** BENCH_PROXY_ENV='{"FENCEPOST_WRITE_CONCURRENCY":"4"}' tries settings without editing code. */
function extraEnv(): Record<string, string> {
  return process.env.BENCH_PROXY_ENV ? (JSON.parse(process.env.BENCH_PROXY_ENV) as Record<string, string>) : {};
}
