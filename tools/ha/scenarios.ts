// The HA run's scenarios, each on the running cluster under load from two leaders of a fence key
// of its own: the old leader (token 1) writes from the start; the new one (token 2) raises the
// fence, writes, and the fault strikes; both go on writing through the failover until the new
// leader has written again on the new primary. Then the new primary is read back and checked.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { check, type Verdict } from './checker.ts';
import type { HaCluster } from './cluster.ts';
import { TwoLeaders, type WriteRecord } from './load.ts';
import type { PatroniNode } from './patroni-node.ts';

export type ScenarioName = 'crash' | 'switchover' | 'stall-then-crash' | 'async-control';

export const SCENARIOS: Readonly<Record<ScenarioName, string>> = {
  crash: 'primary crash: Patroni and Postgres SIGKILLed together',
  switchover: 'switchover to a synchronous standby (Patroni REST POST /switchover)',
  'stall-then-crash': "a synchronous standby's walsender SIGSTOPped (commits wait), then a primary crash",
  'async-control': 'control: asynchronous replication, walsenders stalled before the raise, then a primary crash (must fail the check)',
};

export interface ScenarioResult {
  name: ScenarioName;
  verdict: Verdict;
  /** The primary before and after. */
  from: string;
  to: string;
  /** The synchronous standbys at the fault (none: asynchronous). */
  syncStandbys: string[];
  /** When the fault struck (the stall, for stall-then-crash) and, for a crash, when the primary died. */
  faultAt: number;
  crashAt: number | null;
  /** When another node first answered GET /primary 200 (the check HAProxy routes by). */
  newPrimaryAt: number | null;
  /** The write gap: the longest time between two 200 answers to writes (either leader) over the run. */
  writeGapMs: number;
  /** The proxy's GET /readyz, asked every 500 ms over the run: answers by status (0: none). */
  readyz: Record<string, number>;
  durationMs: number;
}

export interface ScenarioOptions {
  /** Requests in flight per leader. */
  concurrency: number;
  requestTimeoutMs: number;
  /** Writes of the new leader, sent after the fault, to see answered 200 before the run stops. */
  writesAfterFault: number;
  /** Bound on the wait for them. */
  recoveryTimeoutMs: number;
  /** stall-then-crash: how long commits wait on the stalled standby before the crash. */
  stallMs: number;
  log: (line: string) => void;
}

export async function runScenario(cluster: HaCluster, name: ScenarioName, opts: ScenarioOptions): Promise<ScenarioResult> {
  const started = Date.now();
  const sync = name !== 'async-control';
  const primary = await cluster.waitHealthy({ sync, timeoutMs: 90_000 });
  const syncStandbys = sync ? await cluster.syncStandbys(primary) : [];
  const fenceKey = `ha-${name}`;
  const load = new TwoLeaders({
    proxyUrl: cluster.proxyUrl,
    fenceKey,
    prefix: `ha/${name}/`,
    concurrency: opts.concurrency,
    requestTimeoutMs: opts.requestTimeoutMs,
  });
  let faultAt = 0;
  let crashAt: number | null = null;
  let newPrimaryAt: number | null = null;
  let fenceAtTakeover: bigint | null | undefined;
  const readiness = probeReadiness(cluster.proxyUrl);
  try {
    load.startOldLeader();
    await until('the old leader to write', 30_000, () => load.acceptedSince(1, started) >= 5);
    if (name === 'async-control') {
      // Nothing the primary commits from here on reaches a standby: the raise and the new leader's
      // writes are acknowledged (asynchronous commit) and exist only on the primary.
      const stalled = await stallWalsenders(cluster, primary, 'all');
      faultAt = Date.now();
      opts.log(`${name}: SIGSTOP the walsenders to ${stalled.join(', ')} on ${primary.name}`);
    }
    await withTimeout('the raise to token 2', 30_000, load.raise());
    opts.log(`${name}: token 2 raised the fence`);
    await until('the new leader to write', 30_000, () => load.acceptedSince(2, started) >= 5);
    if (name === 'crash' || name === 'async-control') {
      if (name === 'crash') faultAt = Date.now();
      crashAt = Date.now();
      await primary.crash();
      opts.log(`${name}: crashed ${primary.name} (Patroni and Postgres, SIGKILL)`);
    } else if (name === 'switchover') {
      faultAt = Date.now();
      const candidate = syncStandbys[0];
      const r = await primary.rest('POST', '/switchover', { leader: primary.name, candidate }, 30_000);
      opts.log(
        `${name}: POST /switchover ${primary.name} → ${candidate}: ${r?.status ?? 'no answer'} ${typeof r?.json === 'string' ? r.json.trim() : JSON.stringify(r?.json)}`,
      );
      if (r?.status !== 200) throw new Error(`switchover refused: ${r?.status ?? 'no answer'}`);
    } else {
      const stalled = await stallWalsenders(cluster, primary, 'one-sync');
      faultAt = Date.now();
      opts.log(`${name}: SIGSTOP the walsender to ${stalled.join(', ')} on ${primary.name}; commits now wait`);
      await sleep(opts.stallMs);
      crashAt = Date.now();
      await primary.crash();
      opts.log(`${name}: crashed ${primary.name} (Patroni and Postgres, SIGKILL)`);
    }
    // Writes on the new primary: sent once HAProxy's check finds it (GET /primary 200).
    let next: PatroniNode | null = null;
    await cluster.waitFor(
      'a new primary',
      opts.recoveryTimeoutMs,
      async () => (next = await cluster.leader()) !== null && next !== primary,
    );
    newPrimaryAt = Date.now();
    // Read at once, on the node itself: HAProxy sends it writes only after its next check.
    fenceAtTakeover = await readFenceAtTakeover(cluster, next!, fenceKey);
    opts.log(
      `${name}: ${next!.name} answers GET /primary 200, ${newPrimaryAt - faultAt} ms after the fault; the fence there: ${fenceAtTakeover ?? 'not read'}`,
    );
    await until(
      `${opts.writesAfterFault} writes of the new leader on the new primary`,
      opts.recoveryTimeoutMs,
      () => load.acceptedSince(2, newPrimaryAt!) >= opts.writesAfterFault,
    );
  } finally {
    await Promise.all([load.stop(), readiness.stop()]);
    writeFileSync(join(cluster.dir, `${name}.history.jsonl`), load.records.map((r) => JSON.stringify(r)).join('\n') + '\n');
  }
  const next = await waitForPrimary(cluster, 30_000);
  const [rows, finalFenceToken] = await Promise.all([
    cluster.queryVia<{ key: string; token: string }>(
      next.spec.pgPort,
      'SELECT key, token FROM fencepost.objects WHERE starts_with(key, $1)',
      [`ha/${name}/`],
    ),
    readFence(cluster, next, fenceKey),
  ]);
  const verdict = check({
    records: load.records,
    raiseAcknowledgedAt: load.raiseAcknowledgedAt,
    stored: new Map(rows.map((r) => [r.key, BigInt(r.token)])),
    finalFenceToken,
    ...(fenceAtTakeover === undefined ? {} : { fenceAtTakeover }),
  });
  return {
    name,
    verdict,
    from: primary.name,
    to: next.name,
    syncStandbys,
    faultAt,
    crashAt,
    newPrimaryAt,
    writeGapMs: longestSilence(load.records),
    readyz: readiness.counts,
    durationMs: Date.now() - started,
  };
}

/** Asks the proxy's GET /readyz every 500 ms until stopped, counting the answers by status. */
function probeReadiness(proxyUrl: string): { counts: Record<string, number>; stop(): Promise<void> } {
  const counts: Record<string, number> = {};
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const status = await fetch(`${proxyUrl}/readyz`, { signal: AbortSignal.timeout(5000) }).then(
        async (r) => {
          await r.arrayBuffer();
          return r.status;
        },
        () => 0,
      );
      counts[status] = (counts[status] ?? 0) + 1;
      await sleep(500);
    }
  })();
  return {
    counts,
    stop: async () => {
      stopped = true;
      await loop;
    },
  };
}

/** SIGSTOPs the primary's walsenders: all of them, or one synchronous standby's. Returns the standbys' names. */
async function stallWalsenders(cluster: HaCluster, primary: PatroniNode, which: 'all' | 'one-sync'): Promise<string[]> {
  const rows = await cluster.queryVia<{ pid: number; application_name: string }>(
    primary.spec.pgPort,
    `SELECT pid, application_name FROM pg_stat_replication${which === 'one-sync' ? ` WHERE sync_state = 'sync' ORDER BY application_name LIMIT 1` : ''}`,
  );
  if (rows.length === 0) throw new Error(`no ${which === 'one-sync' ? 'synchronous ' : ''}walsender on ${primary.name}`);
  for (const r of rows) process.kill(r.pid, 'SIGSTOP');
  return rows.map((r) => r.application_name);
}

/** The fence's highest token as one node holds it (null: no fence row). */
async function readFence(cluster: HaCluster, node: PatroniNode, fenceKey: string): Promise<bigint | null> {
  const rows = await cluster.queryVia<{ highest_token: string }>(
    node.spec.pgPort,
    'SELECT highest_token FROM fencepost.fences WHERE fence_key = $1',
    [fenceKey],
  );
  return rows[0] ? BigInt(rows[0].highest_token) : null;
}

/**
 * The fence as a node that just took over holds it: read once it has replayed all the WAL it
 * received (a standby acknowledges a synchronous commit when it has flushed it, and may replay it a
 * little later), or once its promotion has ended. Undefined when it could not be read within 5 s.
 */
async function readFenceAtTakeover(cluster: HaCluster, node: PatroniNode, fenceKey: string): Promise<bigint | null | undefined> {
  const deadline = Date.now() + 5000;
  while (Date.now() < deadline) {
    const rows = await cluster
      .queryVia<{ settled: boolean; highest_token: string | null }>(
        node.spec.pgPort,
        `SELECT NOT pg_is_in_recovery() OR coalesce(pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn(), true) AS settled,
                (SELECT highest_token FROM fencepost.fences WHERE fence_key = $1) AS highest_token`,
        [fenceKey],
      )
      .catch(() => []);
    const r = rows[0];
    if (r?.settled) return r.highest_token === null ? null : BigInt(r.highest_token);
    await sleep(50);
  }
  return undefined;
}

async function waitForPrimary(cluster: HaCluster, timeoutMs: number): Promise<PatroniNode> {
  let found: PatroniNode | null = null;
  await cluster.waitFor('a primary to read back from', timeoutMs, async () => (found = await cluster.leader()) !== null);
  return found!;
}

/** Longest time between consecutive 200 answers to writes. */
export function longestSilence(records: readonly WriteRecord[]): number {
  const times = records
    .filter((r) => r.kind === 'write' && r.status === 200)
    .map((r) => r.answeredAt)
    .sort((a, b) => a - b);
  let longest = 0;
  for (let i = 1; i < times.length; i++) longest = Math.max(longest, times[i]! - times[i - 1]!);
  return longest;
}

async function until(what: string, timeoutMs: number, cond: () => boolean): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(100);
  }
}

async function withTimeout<T>(what: string, timeoutMs: number, p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>(
        (_, reject) => (timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)), timeoutMs)),
      ),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
