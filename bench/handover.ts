// Bounded handover past a zombie's open transaction (a benchmark, not a test): three replicas under
// `fencepost elect --proxy`, psycopg2 writers looping BEGIN; INSERT; COMMIT through the SQL endpoint;
// the leader is frozen between INSERT and COMMIT (tools/demo/elected-transaction.ts). Figure: SIGSTOP
// → the new leader's first committed transaction, against the bound session timeout T + raise wait
// (FENCEPOST_RAISE_WAIT_MS) + 500 ms. Needs `npm run build` (bin/fencepost.js runs dist/).
//
//   npx tsx bench/handover.ts        (own Postgres and ZooKeeper; BENCH_HANDOVER_ROUNDS, default 3)
import { portRangeEnv } from '../tools/ports.ts';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { pino } from 'pino';
import { loadConfig } from '../src/proxy/config.ts';
import { startProxy } from '../src/proxy/server.ts';
import { distribution, type Distribution } from '../src/election/advice.ts';
import { LocalZooKeeper } from '../src/demo/local-zookeeper.ts';
import { runElectedTransaction } from '../tools/demo/elected-transaction.ts';
import { benchPostgres, resetZooKeeperStats, FSYNC_STALL_MS, watchWalSync, zooKeeperMaxFsyncMs } from './support.ts';

export interface HandoverBenchResult {
  sessionTimeoutMs: number;
  raiseWaitMs: number;
  boundMs: number;
  freezeToFirstWriteMs: Distribution;
  /** Every round: the zombie's COMMIT failed and its row is absent. */
  zombieRefused: boolean;
  /**
   * Rounds over the bound; of them, rounds with a WAL fsync (watchWalSync) or a ZooKeeper fsync (the
   * bench's own server) of FSYNC_STALL_MS or more.
   */
  overBound: number;
  overBoundDisk: number;
}

export async function runHandoverBench(opts: { rounds?: number; sessionTimeoutMs?: number } = {}): Promise<HandoverBenchResult> {
  const rounds = opts.rounds ?? 3;
  const sessionTimeoutMs = opts.sessionTimeoutMs ?? 2000;
  const db = await benchPostgres('bench_handover');
  const zk = process.env.ZK_CONNECT ? null : await LocalZooKeeper.start({ servers: 1, tickTimeMs: 200 });
  const config = loadConfig({
    DATABASE_URL: db.url,
    PORT: '0',
    FENCEPOST_PGWIRE_PORT: '0',
    FENCEPOST_LOG_LEVEL: 'error',
    ...portRangeEnv(),
  });
  const proxy = await startProxy(config, pino({ level: 'error' }));
  const owner = new pg.Pool({ connectionString: db.url, max: 2 });
  const samples: number[] = [];
  let zombieRefused = true;
  const boundMs = sessionTimeoutMs + config.raiseWaitMs + 500;
  const zkPort = zk?.nodes[0]!.clientPort ?? null;
  const wal = await watchWalSync(db.url);
  let overBound = 0;
  let overBoundDisk = 0;
  try {
    for (let i = 0; i < rounds; i++) {
      const table = `public.handover_${i}`;
      await owner.query(`CREATE TABLE ${table} (key text PRIMARY KEY, token bigint NOT NULL)`);
      await owner.query(`GRANT SELECT, INSERT ON ${table} TO ${pg.escapeIdentifier(config.clientRole)}`);
      wal.mark();
      await resetZooKeeperStats(zkPort);
      const r = await runElectedTransaction({
        zkConnect: process.env.ZK_CONNECT ?? zk!.connectString,
        electionPath: `/fencepost-bench/handover-${process.pid}-${i}-${Date.now()}`,
        proxyUrl: proxy.url,
        pgwire: `127.0.0.1:${proxy.pgwirePort}/${new URL(db.url).pathname.slice(1)}`,
        table,
        fenceKey: `handover-${process.pid}-${i}`,
        pool: owner,
        sessionTimeoutMs,
      });
      samples.push(r.freezeToFirstWriteMs);
      if (r.freezeToFirstWriteMs > boundMs) {
        overBound++;
        if (wal.longestMs() >= FSYNC_STALL_MS || ((await zooKeeperMaxFsyncMs(zkPort)) ?? 0) >= FSYNC_STALL_MS) overBoundDisk++;
      }
      zombieRefused &&= r.zombieCommit.event === 'commit-failed' && !r.zombieRowPresent;
    }
  } finally {
    await wal.stop();
    await owner.end();
    await proxy.close();
    await zk?.stop();
    await db.stop();
  }
  return {
    sessionTimeoutMs,
    raiseWaitMs: config.raiseWaitMs,
    boundMs,
    freezeToFirstWriteMs: distribution(samples),
    zombieRefused,
    overBound,
    overBoundDisk,
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const r = await runHandoverBench({ rounds: Number(process.env.BENCH_HANDOVER_ROUNDS ?? 3) });
  process.stdout.write(JSON.stringify(r, null, 2) + '\n');
}
