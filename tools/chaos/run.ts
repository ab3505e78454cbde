// A chaos run: start the cluster, wait for leaders, put it under load while the nemesis injects the
// seed's fault schedule, let it settle, stop the writers, then check the history against the
// database. Leaves in the run directory: schedule.txt/json, history.jsonl (paired operations),
// faults.jsonl, writers/*.jsonl (raw records), logs/.
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import type { FenceMode } from '../unsafe-fence.ts';
import { check, COUNT_LOSS_WINDOW_MS, type CheckResult, type CountLoss } from './checker.ts';
import { ChaosCluster } from './cluster.ts';
import { readFinalState } from './final-state.ts';
import { probeStaleWrites } from './probe.ts';
import { readHistory, writeOperations, type Door, type Operation } from './history.ts';
import { describeFault, planSchedule, runNemesis, type FaultEvent, type FaultKind, type PlannedFault } from './nemesis.ts';
import { formatReport } from './report.ts';
import { verdictOf, type Verdict } from './verdict.ts';

/** The defaults of a chaos run, in one place (npm run chaos's flags show the same). */
export const CHAOS_DEFAULTS = Object.freeze({
  durationS: 30,
  writers: 4,
  proxies: 2,
  fenceKeyCount: 2,
  fenceMode: 'strict' as FenceMode,
  sessionTimeoutMs: 2000,
  intervalMs: 50,
  workMs: 20,
  requestTimeoutMs: 3000,
  settleMs: 2000,
});

/**
 * Doors of the writer slots, cycled (w1 http, w2 sql, w3 tx, w4 sql, …): half the writers write
 * through the SQL endpoint, half over HTTP, some of those through /v1/transactions. With a broken
 * fence (the checker's self-test) every writer uses PUT, the only door that mode breaks.
 */
export const doorsFor = (fenceMode: FenceMode): readonly Door[] => (fenceMode === 'strict' ? ['http', 'sql', 'tx', 'sql'] : ['http']);

export interface ChaosOptions {
  seed: number;
  /** Length of the load phase, while faults are injected. */
  durationMs: number;
  writers?: number;
  /** Door of each writer slot, cycled; default doorsFor(fenceMode). */
  doors?: readonly Door[];
  proxies?: number;
  fenceKeyCount?: number;
  fenceMode?: FenceMode;
  sessionTimeoutMs?: number;
  intervalMs?: number;
  workMs?: number;
  requestTimeoutMs?: number;
  /** Fault kinds to draw from (default all) and quiet time between faults of a lane. */
  kinds?: readonly FaultKind[];
  gapMs?: readonly [number, number];
  /** After the last fault, time for the system to recover before the writers stop. Default 2000 ms. */
  settleMs?: number;
  /** Run directory; default a new temp dir, kept (without database and ZooKeeper data) for inspection. */
  dir?: string;
  /** Remove the whole run directory at the end. Default false. */
  cleanup?: boolean;
  print?: (line: string) => void;
  /** Aborting ends the run early: every process is stopped and runChaos rejects. */
  signal?: AbortSignal;
}

export interface ChaosResult {
  /** The verdict passed: no violation, every started fault applied, writes acknowledged (verdict.ts). */
  ok: boolean;
  verdict: Verdict;
  seed: number;
  schedule: PlannedFault[];
  faults: FaultEvent[];
  ops: Operation[];
  check: CheckResult;
  report: string;
  loadMs: number;
  dir: string;
}

export const fenceKeysFor = (n: number): string[] => Array.from({ length: n }, (_, i) => `chaos/${String.fromCharCode(97 + i)}`);

export function scheduleFor(o: ChaosOptions): PlannedFault[] {
  return planSchedule({
    seed: o.seed,
    durationMs: o.durationMs,
    writers: o.writers ?? CHAOS_DEFAULTS.writers,
    proxies: o.proxies ?? CHAOS_DEFAULTS.proxies,
    zkServers: 3,
    fenceKeys: fenceKeysFor(o.fenceKeyCount ?? CHAOS_DEFAULTS.fenceKeyCount),
    sessionTimeoutMs: o.sessionTimeoutMs ?? CHAOS_DEFAULTS.sessionTimeoutMs,
    ...(o.kinds ? { kinds: o.kinds } : {}),
    ...(o.gapMs ? { gapMs: o.gapMs } : {}),
  });
}

export async function runChaos(o: ChaosOptions): Promise<ChaosResult> {
  const print = o.print ?? ((l: string) => process.stdout.write(l + '\n'));
  const writers = o.writers ?? CHAOS_DEFAULTS.writers;
  const proxies = o.proxies ?? CHAOS_DEFAULTS.proxies;
  const fenceMode = o.fenceMode ?? CHAOS_DEFAULTS.fenceMode;
  const fenceKeys = fenceKeysFor(o.fenceKeyCount ?? CHAOS_DEFAULTS.fenceKeyCount);
  if (writers < 2) throw new Error('chaos needs at least 2 writers');
  if (proxies < 1) throw new Error('chaos needs at least 1 proxy');
  const dir = o.dir ?? mkdtempSync(join(tmpdir(), 'fencepost-chaos-'));
  mkdirSync(dir, { recursive: true });
  chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
  const schedule = scheduleFor(o);
  writeFileSync(join(dir, 'schedule.json'), JSON.stringify({ seed: o.seed, durationMs: o.durationMs, schedule }, null, 2) + '\n');
  writeFileSync(join(dir, 'schedule.txt'), schedule.map(describeFault).join('\n') + '\n');
  print(`seed ${o.seed}: ${schedule.length} faults planned over ${(o.durationMs / 1000).toFixed(1)} s`);
  for (const f of schedule) print('  ' + describeFault(f));

  let cluster: ChaosCluster | null = null;
  try {
    cluster = await ChaosCluster.start({
      dir,
      writers,
      doors: o.doors ?? doorsFor(fenceMode),
      proxies,
      fenceKeys,
      electionRoot: `/fencepost/chaos/${randomBytes(4).toString('hex')}`,
      fenceMode,
      sessionTimeoutMs: o.sessionTimeoutMs ?? CHAOS_DEFAULTS.sessionTimeoutMs,
      intervalMs: o.intervalMs ?? CHAOS_DEFAULTS.intervalMs,
      workMs: o.workMs ?? CHAOS_DEFAULTS.workMs,
      requestTimeoutMs: o.requestTimeoutMs ?? CHAOS_DEFAULTS.requestTimeoutMs,
      zkTickMs: 200,
      log: (l) => print(l),
    });
    await cluster.waitForLeaders(30_000);
    o.signal?.throwIfAborted();

    // Load and faults.
    const startedAt = Date.now();
    print(`load started; every fence key has a leader`);
    // The load phase lasts durationMs, longer while the nemesis is still behind its schedule (a
    // loaded box heals faults slowly), up to twice durationMs.
    const end = new AbortController();
    let nemesisDone = false;
    const timer = setTimeout(() => nemesisDone && end.abort(), o.durationMs);
    const overtime = setTimeout(() => end.abort(), 2 * o.durationMs);
    const onAbort = () => end.abort();
    o.signal?.addEventListener('abort', onAbort, { once: true });
    const faultLines: string[] = [];
    const faults = await runNemesis(schedule, cluster, {
      startedAt,
      signal: end.signal,
      onFault: (e) => {
        faultLines.push(JSON.stringify(e));
        print(
          `  +${((e.startedAt - startedAt) / 1000).toFixed(1)}s fault #${e.n} ${e.kind} ${e.target} (${e.endedAt - e.startedAt} ms)${e.error ? ' FAILED: ' + e.error : ''}`,
        );
      },
    });
    nemesisDone = true;
    const left = startedAt + o.durationMs - Date.now();
    if (left > 0 && !end.signal.aborted) await new Promise((r) => end.signal.addEventListener('abort', r, { once: true }));
    clearTimeout(timer);
    clearTimeout(overtime);
    o.signal?.removeEventListener('abort', onAbort);
    o.signal?.throwIfAborted();
    const loadMs = Date.now() - startedAt;
    writeFileSync(join(dir, 'faults.jsonl'), faultLines.join('\n') + '\n');

    // Everything back up, a moment to recover, then the writers stop and the history is closed.
    for (let i = 0; i < proxies; i++) await cluster.startProxy(i);
    await cluster.startPostgres();
    await new Promise((r) => setTimeout(r, o.settleMs ?? CHAOS_DEFAULTS.settleMs));
    await cluster.stopWriters(5000);
    const probes = await probeStaleWrites(cluster, fenceKeys, o.requestTimeoutMs ?? CHAOS_DEFAULTS.requestTimeoutMs);
    print(`zombie probe: ${probes} writes below their fence's token, one per door and fence key`);

    const ops = readHistory(cluster.historyDir);
    writeOperations(join(dir, 'history.jsonl'), ops);
    const keys = [...new Set(ops.map((op) => op.key).filter((k): k is string => k !== null))];
    const final = await readFinalState(cluster.databaseUrl, cluster.proxyUrls, keys);
    // A proxy killed with SIGKILL loses the SQL-door counts it had not added yet (checker.ts, invariant 4).
    const { proxyUrls, pgwireUrls } = cluster;
    const countLoss: CountLoss[] = faults.flatMap((e) => {
      const planned = schedule.find((f) => f.n === e.n);
      if (planned?.kind !== 'restart-proxy' || planned.signal !== 'SIGKILL') return [];
      return [
        { proxies: [proxyUrls[planned.proxy]!, pgwireUrls[planned.proxy]!], from: e.startedAt - COUNT_LOSS_WINDOW_MS, to: e.endedAt },
      ];
    });
    const result = check(ops, final, countLoss);
    const verdict = verdictOf({ check: result, schedule, faults, ops });
    const report = formatReport({ seed: o.seed, loadMs, fenceMode, writers, proxies, ops, faults, check: result, verdict, dir });
    return { ok: verdict.outcome === 'pass', verdict, seed: o.seed, schedule, faults, ops, check: result, report, loadMs, dir };
  } finally {
    await cluster?.stop();
    if (o.cleanup) rmSync(dir, { recursive: true, force: true });
    else for (const d of ['postgres', 'zookeeper']) rmSync(join(dir, d), { recursive: true, force: true });
  }
}
