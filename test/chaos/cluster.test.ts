// The chaos cluster cleans up after itself when it cannot start (nothing it started is left running),
// and its faults overlap: a writer restarts while Postgres is down.
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, test } from 'vitest';
import { ChaosCluster } from '../../tools/chaos/cluster.ts';

/** Pids of processes whose command line mentions `dir`. */
function processesUnder(dir: string): number[] {
  return execFileSync('ps', ['-eo', 'pid=,args='], { encoding: 'utf8' })
    .split('\n')
    .filter((l) => l.includes(dir))
    .map((l) => Number(l.trim().split(/\s+/)[0]));
}

test('when Postgres cannot start, the ZooKeeper ensemble started beside it is stopped too', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-chaos-cluster-'));
  writeFileSync(join(dir, 'postgres'), 'a file where the data folder should go\n');
  try {
    await expect(
      ChaosCluster.start({
        dir,
        writers: 2,
        proxies: 1,
        fenceKeys: ['chaos/a'],
        electionRoot: '/fencepost/chaos-cluster-test',
        fenceMode: 'strict',
        sessionTimeoutMs: 2000,
        intervalMs: 50,
        workMs: 0,
        requestTimeoutMs: 1000,
        zkTickMs: 200,
        log: () => {},
      }),
    ).rejects.toThrow();
    // Postgres fails at once, before the ensemble has spawned its JVMs: give a leak time to show.
    await new Promise((r) => setTimeout(r, 5000));
    expect(processesUnder(dir)).toEqual([]);
  } finally {
    for (const pid of processesUnder(dir)) process.kill(pid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
}, 120_000);

test('a writer killed and restarted while Postgres is down starts (the faults of the two lanes overlap)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-chaos-cluster-'));
  chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
  const cluster = await ChaosCluster.start({
    dir,
    writers: 2,
    doors: ['http', 'sql'],
    proxies: 1,
    fenceKeys: ['chaos/a'],
    electionRoot: '/fencepost/chaos-cluster-test-overlap',
    fenceMode: 'strict',
    sessionTimeoutMs: 2000,
    intervalMs: 50,
    workMs: 0,
    requestTimeoutMs: 1000,
    zkTickMs: 200,
    log: () => {},
  });
  try {
    const url = cluster.databaseUrl;
    await cluster.stopPostgres(true);
    await cluster.killWriter(1);
    await cluster.startWriter(1); // its SQL door names Postgres's database: known while it is down
    expect(cluster.databaseUrl).toBe(url);
    await cluster.startPostgres();
  } finally {
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}, 120_000);
