// `npm run ha`: the tested HA deployment (tools/ha/cluster.ts) put through its scenarios, in order,
// on one cluster: a primary crash, a switchover, a stalled walsender then a crash, each under load
// from two leaders and checked (tools/ha/checker.ts); then the asynchronous control run, which
// the same check must catch. A crashed node is started again (it rejoins as a standby) before the
// next scenario. Exits 0 only when the synchronous scenarios pass and the control run fails the
// check. Every process and the run folder are removed at the end, on failure and on a hard
// timeout too (--keep keeps the folder: logs of every process).
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { summarizeViolations, type LeaderCounts } from './checker.ts';
import { HaCluster } from './cluster.ts';
import { ZOOKEEPER_JAR } from '../../src/demo/local-zookeeper.ts';
import { runScenario, SCENARIOS, type ScenarioName, type ScenarioResult } from './scenarios.ts';

const USAGE = `usage: npm run ha -- [--only <scenario>[,…]] [--stall-ms <n>] [--timeout-s <n>] [--keep]
  Starts ZooKeeper, three Patroni nodes (Postgres 15, synchronous_mode_strict), HAProxy and the
  fencepost proxy on loopback, and runs, under load from two leaders:
${Object.entries(SCENARIOS)
  .map(([k, v]) => `    ${k.padEnd(17)} ${v}`)
  .join('\n')}
  --only       a comma-separated subset, in that order (default: all)
  --stall-ms   stall-then-crash: how long commits wait on the stalled standby before the crash
               (default 4000; past the proxy's query timeout, 15 s, its answer to a commit still
               waiting is tested too)
  --timeout-s  hard bound on the whole run (default 360): past it, everything is stopped, exit 1
  --keep       keep the run folder (every process's log) instead of removing it`;

const ALL = Object.keys(SCENARIOS) as ScenarioName[];

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      only: { type: 'string' },
      'stall-ms': { type: 'string' },
      'timeout-s': { type: 'string' },
      keep: { type: 'boolean' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const only = values.only === undefined ? ALL : values.only.split(',').map((s) => s.trim());
  const unknown = only.filter((s) => !ALL.includes(s as ScenarioName));
  if (unknown.length > 0) {
    console.error(`unknown scenario ${unknown.join(', ')}\n${USAGE}`);
    return 2;
  }
  const timeoutS = Number(values['timeout-s'] ?? 360);
  if (!Number.isFinite(timeoutS) || timeoutS <= 0) {
    console.error(`--timeout-s must be a positive number\n${USAGE}`);
    return 2;
  }
  const missing = missingPrerequisites();
  if (missing.length > 0) {
    console.error(`FAIL: the HA run needs ${missing.join('; ')}. scripts/setup.sh --ha installs them.`);
    return 1;
  }
  const stallMs = Number(values['stall-ms'] ?? 4000);
  if (!Number.isInteger(stallMs) || stallMs < 0) {
    console.error(`--stall-ms must be a whole number of milliseconds\n${USAGE}`);
    return 2;
  }
  const t0 = Date.now();
  const log = (line: string) => console.log(`+${((Date.now() - t0) / 1000).toFixed(1).padStart(6)}s  ${line}`);
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-ha-'));
  const cluster = new HaCluster({ dir, log });
  let cleaned = false;
  const cleanup = async () => {
    if (cleaned) return;
    cleaned = true;
    await cluster.stop().catch((err: unknown) => console.error(`stopping the cluster: ${String(err)}`));
    if (values.keep) console.log(`run folder kept: ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  };
  const hardStop = setTimeout(() => {
    console.error(`FAIL: the HA run exceeded --timeout-s ${timeoutS}; stopping everything`);
    void cleanup().finally(() => process.exit(1));
  }, timeoutS * 1000);
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => void cleanup().finally(() => process.exit(130)));

  const results: ScenarioResult[] = [];
  let synchronous = true;
  try {
    await cluster.start();
    log(`cluster up: ${cluster.nodes.map((n) => n.name).join(', ')}`);
    for (const name of only as ScenarioName[]) {
      if (name === 'async-control') {
        synchronous = false;
        await cluster.patchConfig({ synchronous_mode: false, synchronous_mode_strict: false, maximum_lag_on_failover: 1024 * 1024 * 1024 });
        const primary = await cluster.waitHealthy({ sync: false, timeoutMs: 60_000 });
        await cluster.waitFor(
          'synchronous_standby_names to be emptied',
          30_000,
          async () =>
            (await cluster.queryVia<{ s: string }>(primary.spec.pgPort, `SELECT current_setting('synchronous_standby_names') AS s`).then(
              (r) => r[0]?.s,
              () => null,
            )) === '',
        );
        log('asynchronous replication: synchronous_mode off, maximum_lag_on_failover 1 GiB');
      }
      log(`scenario ${name}: ${SCENARIOS[name]}`);
      const r = await runScenario(cluster, name, {
        concurrency: 2,
        requestTimeoutMs: 20_000,
        writesAfterFault: 10,
        recoveryTimeoutMs: 60_000,
        stallMs,
        log,
      });
      results.push(r);
      log(`scenario ${name}: ${r.from} → ${r.to}, write gap ${r.writeGapMs} ms, ${r.verdict.violations.length} violation(s)`);
      // A crashed node comes back as a standby of the new primary before the next scenario.
      if (cluster.nodes.some((n) => !n.running) && name !== only[only.length - 1]) await rejoin(cluster, synchronous, log);
    }
  } catch (err) {
    console.error(`FAIL: ${err instanceof Error ? err.message : String(err)}`);
    printLogTails(dir);
    printReport(results);
    return 1;
  } finally {
    clearTimeout(hardStop);
    await cleanup();
  }
  printReport(results);
  const failures: string[] = [];
  for (const r of results) {
    if (r.name === 'async-control') {
      if (r.verdict.violations.length === 0)
        failures.push('async-control: the check found nothing wrong with asynchronous replication: it cannot see a lost fence');
    } else if (r.verdict.violations.length > 0) {
      failures.push(`${r.name}: ${r.verdict.violations.length} violation(s)`);
    }
  }
  const passed = results.some((r) => r.name === 'async-control')
    ? 'PASS: the fence survived every failover, and the check caught the asynchronous control run'
    : 'PASS: the fence survived every failover';
  log(failures.length === 0 ? passed : `FAIL: ${failures.join('; ')}`);
  return failures.length === 0 ? 0 : 1;
}

/**
 * Starts the nodes that are down and waits until every node streams again. A node that has not
 * rejoined within 45 s gets its Patroni restarted once (seen once in ten runs: a crashed node's
 * Patroni kept logging "Waiting for checkpoint on <new primary> before rewind" for over a minute).
 */
async function rejoin(cluster: HaCluster, sync: boolean, log: (line: string) => void): Promise<void> {
  for (const n of cluster.nodes) if (!n.running) n.start();
  try {
    await cluster.waitHealthy({ sync, timeoutMs: 45_000 });
    return;
  } catch {
    // restart below
  }
  for (const n of await cluster.notStreaming()) {
    log(`${n.name} has not rejoined after 45 s: restarting its Patroni`);
    await n.stop();
    n.start();
  }
  await cluster.waitHealthy({ sync, timeoutMs: 60_000 });
}

/** What the run needs and this machine lacks, each named with its Debian package. */
function missingPrerequisites(): string[] {
  const missing: string[] = [];
  const runs = (cmd: string, args: string[]) => spawnSync(cmd, args, { stdio: 'ignore' }).status === 0;
  if (!runs('patroni', ['--version'])) missing.push('patroni (apt-get install patroni)');
  if (!runs('/usr/bin/python3', ['-c', 'import kazoo'])) missing.push("Patroni's ZooKeeper client (apt-get install python3-kazoo)");
  if (!runs('haproxy', ['-v'])) missing.push('haproxy (apt-get install haproxy)');
  if (!existsSync('/usr/lib/postgresql/15/bin/postgres')) missing.push('Postgres 15 (apt-get install postgresql-15)');
  if (!existsSync(ZOOKEEPER_JAR)) missing.push('ZooKeeper (apt-get install zookeeper)');
  if (!existsSync(join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js'))) missing.push('a built proxy (npm run build)');
  return missing;
}

function printReport(results: readonly ScenarioResult[]): void {
  if (results.length === 0) return;
  console.log('\nscenario          primary        leader  sent  200  409  503 (by code)                     none  unacked-committed');
  for (const r of results) {
    for (const leader of ['1', '2'] as const) {
      const c: LeaderCounts = r.verdict.leaders[leader];
      const unavailable =
        Object.entries(c.unavailable)
          .map(([k, v]) => `${k} ${v}`)
          .join(', ') || '0';
      console.log(
        `${(leader === '1' ? r.name : '').padEnd(17)} ${(leader === '1' ? `${r.from} → ${r.to}` : '').padEnd(14)} token ${leader} ${String(c.sent).padStart(5)} ${String(c.accepted).padStart(4)} ${String(c.stale).padStart(4)}  ${unavailable.padEnd(32)} ${String(c.noAnswer).padStart(4)}  ${c.committedUnacknowledged}`,
      );
    }
    const crash = r.crashAt === null || r.crashAt === r.faultAt ? '' : `the crash ${r.crashAt - r.faultAt} ms after the fault, `;
    const promoted = r.newPrimaryAt === null ? '' : `new primary (GET /primary 200) ${r.newPrimaryAt - r.faultAt} ms after the fault; `;
    console.log(
      `${''.padEnd(17)} ${crash}${promoted}write gap (longest time without a 200) ${r.writeGapMs} ms; ${(r.durationMs / 1000).toFixed(1)} s`,
    );
    console.log(
      `${''.padEnd(17)} GET /readyz every 500 ms: ${Object.entries(r.readyz)
        .map(([status, n]) => `${n} × ${status === '0' ? 'no answer' : status}`)
        .join(', ')}`,
    );
    const summary = summarizeViolations(r.verdict.violations);
    console.log(
      summary.length === 0
        ? `${''.padEnd(17)} check: OK`
        : `${''.padEnd(17)} check: ${r.verdict.violations.length} violation(s)\n${summary.map((l) => `${''.padEnd(19)}${l}`).join('\n')}`,
    );
  }
  console.log('');
}

function printLogTails(dir: string): void {
  for (const f of ['node1.log', 'node2.log', 'node3.log', 'haproxy.log', 'fencepost.log']) {
    try {
      const lines = readFileSync(join(dir, f), 'utf8').trimEnd().split('\n');
      console.error(`--- last lines of ${f} ---\n${lines.slice(-40).join('\n')}`);
    } catch {
      // not written
    }
  }
}

// Exit at once: a process of the run that outlived stop() must not keep this one waiting.
process.exit(await main());
