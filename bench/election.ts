// Election timings (a benchmark, not a test): graceful handover, crash failover against the session
// timeout, handover time against the number of candidates, and the doctor's measurements.
//
//   npx tsx bench/election.ts            (starts its own ZooKeeper, tickTime 200 ms)
//   ZK_CONNECT=host:2181 ZK_TICK_MS=2000 npx tsx bench/election.ts
//
// A "crash" abandons the leader's session: its socket is closed without closing the session, which
// is what the server sees when a process is SIGKILLed (the kernel closes the socket). The server keeps
// the session, and so the leader's node, until the session timeout passes.
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { Election } from '../src/election/election.ts';
import { distribution, measureSessionTimeoutAdvice } from '../src/election/advice.ts';
import type { Distribution, SessionTimeoutAdvice } from '../src/election/advice.ts';
import { LocalZooKeeper } from '../src/demo/local-zookeeper.ts';
import { resetZooKeeperStats, zooKeeperMaxFsyncMs } from './support.ts';

/** A graceful handover over this is slow (the target is p99 < 50 ms). */
const SLOW_HANDOVER_MS = 50;
/** A ZooKeeper transaction-log fsync at least this long in a slow round is the disk's doing. */
const ZK_FSYNC_STALL_MS = 25;

export interface HandoverFigures {
  candidates: number;
  /** resign() called → another candidate's 'elected', in ms. */
  handoverMs: Distribution;
  /**
   * Rounds over SLOW_HANDOVER_MS; of them, rounds in which ZooKeeper's longest transaction-log fsync
   * (mntr zk_max_fsynctime after srst) was ZK_FSYNC_STALL_MS or more. Null without the bench's own server.
   */
  slow: { rounds: number; withFsyncStall: number } | null;
}

export interface ElectionBenchResult {
  zookeeper: { connect: string; tickTimeMs: number; ownServer: boolean };
  graceful: HandoverFigures;
  byCandidates: HandoverFigures[];
  crash: {
    sessionTimeoutMs: number;
    /** Leader's connection dropped without closing the session → standby 'elected', in ms. */
    failoverMs: Distribution;
    /** The target: session timeout + one tick + 200 ms. */
    boundMs: number;
    withinBound: boolean;
  };
  doctor: SessionTimeoutAdvice;
  targets: { gracefulP99Under50Ms: boolean; crashWithinBound: boolean; flatInCandidates: boolean };
}

const now = (): number => performance.now();
let pathSeq = 0;
const benchPath = (name: string): string => `/fencepost-bench/${name}-${process.pid}-${++pathSeq}-${Date.now()}`;

function nextElected(es: readonly Election[], except: Election): Promise<number> {
  return new Promise((resolve) => {
    const offs: Array<() => void> = [];
    for (const e of es) {
      if (e === except) continue;
      const h = (): void => {
        const t = now();
        for (const off of offs) off();
        resolve(t);
      };
      e.on('elected', h);
      offs.push(() => e.off('elected', h));
    }
  });
}

async function settled(es: readonly Election[]): Promise<Election> {
  for (;;) {
    const ls = es.filter((e) => e.isLeader);
    if (ls.length === 1 && es.every((e) => e.nodePath !== null)) return ls[0]!;
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** `zkPort`: the client port of the bench's own ZooKeeper (its fsyncs are read per round), else null. */
export async function benchHandover(
  connect: string,
  candidates: number,
  rounds: number,
  zkPort: number | null = null,
): Promise<HandoverFigures> {
  const path = benchPath(`handover-${candidates}`);
  const es = Array.from({ length: candidates }, (_, i) => new Election({ connect, path, id: `c${i}`, sessionTimeoutMs: 10_000 }));
  await Promise.all(es.map((e) => e.start()));
  const samples: number[] = [];
  let slow = 0;
  let withFsyncStall = 0;
  try {
    for (let i = 0; i < rounds + 2; i++) {
      const leader = await settled(es);
      await new Promise((r) => setTimeout(r, 20)); // let the previous round's traffic drain
      await resetZooKeeperStats(zkPort);
      const next = nextElected(es, leader);
      const t0 = now();
      void leader.resign();
      const t1 = await next;
      if (i < 2) continue; // two warm-up rounds
      samples.push(t1 - t0);
      if (t1 - t0 > SLOW_HANDOVER_MS) {
        slow++;
        if (((await zooKeeperMaxFsyncMs(zkPort)) ?? 0) >= ZK_FSYNC_STALL_MS) withFsyncStall++;
      }
    }
  } finally {
    await Promise.all(es.map((e) => e.close()));
  }
  return { candidates, handoverMs: distribution(samples), slow: zkPort === null ? null : { rounds: slow, withFsyncStall } };
}

export async function benchCrash(connect: string, sessionTimeoutMs: number, rounds: number): Promise<Distribution> {
  const path = benchPath('crash');
  const make = async (id: string): Promise<Election> => {
    const e = new Election({ connect, path, id, sessionTimeoutMs });
    await e.start();
    return e;
  };
  let leader = await make('first');
  await leader.waitForLeadership();
  const samples: number[] = [];
  for (let i = 0; i < rounds; i++) {
    const standby = await make(`standby-${i}`);
    await new Promise((r) => setTimeout(r, 50)); // standby is watching its predecessor
    const next = nextElected([standby], leader);
    const t0 = now();
    leader.currentSession!.abandon(); // the process "dies": no close-session, socket closed
    const t1 = await next;
    samples.push(t1 - t0);
    await leader.close();
    leader = standby;
  }
  await leader.close();
  return distribution(samples);
}

export async function runElectionBench(
  opts: { rounds?: number; crashRounds?: number; sessionTimeoutMs?: number } = {},
): Promise<ElectionBenchResult> {
  const rounds = opts.rounds ?? 30;
  const crashRounds = opts.crashRounds ?? 20;
  const sessionTimeoutMs = opts.sessionTimeoutMs ?? 2000;
  const own = process.env.ZK_CONNECT ? null : await LocalZooKeeper.start({ servers: 1, tickTimeMs: 200 });
  const connect = process.env.ZK_CONNECT ?? own!.connectString;
  const tickTimeMs = own ? own.tickTimeMs : Number(process.env.ZK_TICK_MS ?? 2000);
  try {
    const byCandidates: HandoverFigures[] = [];
    for (const n of [2, 10, 50]) byCandidates.push(await benchHandover(connect, n, rounds, own?.nodes[0]!.clientPort ?? null));
    const crashMs = await benchCrash(connect, sessionTimeoutMs, crashRounds);
    const doctor = await measureSessionTimeoutAdvice({ connect, windowMs: 3000 });
    const boundMs = sessionTimeoutMs + tickTimeMs + 200;
    const graceful = byCandidates[0]!;
    const medians = byCandidates.map((b) => b.handoverMs.median);
    return {
      zookeeper: { connect, tickTimeMs, ownServer: own !== null },
      graceful,
      byCandidates,
      crash: { sessionTimeoutMs, failoverMs: crashMs, boundMs, withinBound: crashMs.max <= boundMs },
      doctor,
      targets: {
        gracefulP99Under50Ms: graceful.handoverMs.p99 < 50,
        crashWithinBound: crashMs.max <= boundMs,
        // "flat": the 50-candidate median within 2× (+5 ms) of the 2-candidate median
        flatInCandidates: Math.max(...medians) <= 2 * Math.min(...medians) + 5,
      },
    };
  } finally {
    await own?.stop();
  }
}

function fmt(d: Distribution): string {
  return `p50 ${d.median.toFixed(1)} ms, p99 ${d.p99.toFixed(1)} ms, max ${d.max.toFixed(1)} ms (n=${d.samples})`;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const r = await runElectionBench({
    rounds: Number(process.env.BENCH_ROUNDS ?? 30),
    crashRounds: Number(process.env.BENCH_CRASH_ROUNDS ?? 20),
  });
  const out = [
    `ZooKeeper ${r.zookeeper.ownServer ? 'standalone (started by the bench)' : r.zookeeper.connect}, tickTime ${r.zookeeper.tickTimeMs} ms`,
    ...r.byCandidates.map(
      (b) => `graceful handover, ${String(b.candidates).padStart(2)} candidates: ${fmt(b.handoverMs)}${b.slow ? `; ${slowRounds(b)}` : ''}`,
    ),
    `crash failover, session timeout ${r.crash.sessionTimeoutMs} ms: ${fmt(r.crash.failoverMs)}; bound ${r.crash.boundMs} ms → ${r.crash.withinBound ? 'within' : 'EXCEEDED'}`,
    `doctor: RTT ${fmt(r.doctor.rttMs)}; event-loop stall ${fmt(r.doctor.eventLoopStallMs)}; recommends ${r.doctor.recommendedSessionTimeoutMs} ms`,
    `targets: ${JSON.stringify(r.targets)}`,
  ];
  process.stdout.write(out.join('\n') + '\n');
  process.stdout.write(JSON.stringify(r, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v)) + '\n');
}

/** "rounds over 50 ms: 2, with a ZooKeeper fsync ≥ 25 ms: 2" (the report's wording). */
export function slowRounds(h: HandoverFigures): string {
  return h.slow === null
    ? ''
    : `rounds over ${SLOW_HANDOVER_MS} ms: ${h.slow.rounds}, with a ZooKeeper fsync ≥ ${ZK_FSYNC_STALL_MS} ms: ${h.slow.withFsyncStall}`;
}
