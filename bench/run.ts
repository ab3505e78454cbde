// `npm run bench`: one report, as markdown: fenced write throughput and latency against direct
// Postgres and the unfenced path, two proxy instances, proxy memory under load; a leader's writes
// under one fence key, distinct fence keys and SQL transactions against direct Postgres with C load
// generators (wrk, pgbench), a fence raise under load, reads with a million rows; pgbench through
// the SQL endpoint against direct Postgres and PgBouncer; what protected data's database check
// costs each door's write (bench/protected.ts: each door unprotected and protected, back to back);
// bounded handover: a raise's latency past each kind of older-token holder, on both raise doors
// (bench/raise-latency.ts, BENCH_RAISE_ROUNDS rounds each); election handover and crash failover
// (in-process and with a real SIGKILL); the handover past a zombie's open transaction
// (bench/handover.ts); CPU per operation of Postgres, the proxy, PgBouncer and the load generator
// for every throughput row, each also with Postgres pinned to one core (bench/cpu.ts,
// bench/placement.ts; BENCH_PLACEMENT); the proxy's RSS over a soak on each door (bench/soak.ts,
// BENCH_SOAK_S); the runtime's floor, Node servers with no logic under the same loads
// (bench/floor.ts, the SQL endpoint's path `relay`). Figures, not pass/fail.
import { runProxyBench, proxyCpuRows, proxyTable } from './proxy.ts';
import { runFenceKeyBench, fenceKeyCpuRows, fenceKeyTables } from './fence-key.ts';
import { runSqlEndpointBench, sqlEndpointCpuRows, sqlEndpointTable } from './sql-endpoint.ts';
import { runSoakBench, soakTable } from './soak.ts';
import { httpFloorTable, runHttpFloorBench } from './floor.ts';
import { cpuTable } from './cpu.ts';
import { pinnedDescription, placements } from './placement.ts';
import { runElectionBench, slowRounds } from './election.ts';
import { benchSigkillFailover } from './crash.ts';
import { protectedTable } from './protected.ts';
import { runHandoverBench } from './handover.ts';
import { runRaiseLatencyBench, raiseLatencyTable } from './raise-latency.ts';
import { LocalZooKeeper } from '../src/demo/local-zookeeper.ts';
import { fmt, machine, FSYNC_STALL_MS } from './support.ts';
import type { Distribution } from '../src/election/advice.ts';

const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
const soakS = Number(process.env.BENCH_SOAK_S ?? 20);
const tableRows = Number(process.env.BENCH_TABLE_ROWS ?? 1_000_000);
const say = (s: string) => process.stderr.write(`[bench] ${s}\n`);
const row = (name: string, d: Distribution, target: string) =>
  `| ${name} | ${fmt(d.median)} | ${fmt(d.p99)} | ${fmt(d.max)} | ${d.samples} | ${target} |`;

say(`placements: ${placements().join(', ')} (BENCH_PLACEMENT); pinned: ${pinnedDescription()}`);
say(`proxy: ${durationS} s per path at 32 connections`);
const proxy = await runProxyBench({ durationS });
say(
  `fence keys: wrk and pgbench, ${durationS} s per path (the HTTP doors also with their data protected); a raise under load; reads with ${tableRows.toLocaleString('en')} rows`,
);
const fenceKey = await runFenceKeyBench({ durationS, tableRows, log: say });
say(`the runtime's floor: node:http and a bare fastify route under the one-fence wrk load, ${durationS} s each`);
const floor = await runHttpFloorBench({ durationS, log: say });
say(
  `SQL endpoint: pgbench direct, through the endpoint (unprotected and protected), through PgBouncer and through a bare Node TCP relay, ${durationS} s per path and mode`,
);
const sqlEndpoint = await runSqlEndpointBench({ durationS, log: say });
say(`proxy memory: a ${soakS} s soak on each door (BENCH_SOAK_S)`);
const soak = await runSoakBench({ seconds: soakS, log: say });
const raiseRounds = Number(process.env.BENCH_RAISE_ROUNDS ?? 20);
say(`bounded handover: a raise past each kind of older-token holder, PUT /v1/fences and the SQL endpoint, ${raiseRounds} rounds each`);
const raiseLatency = await runRaiseLatencyBench({ rounds: raiseRounds, log: say });
say('election: handover with 2, 10, 50 candidates; crash failover');
const election = await runElectionBench({ rounds: 30, crashRounds: 10 });
say('election: crash failover with a real SIGKILL of a `fencepost elect` process');
const zk = process.env.ZK_CONNECT ? null : await LocalZooKeeper.start({ servers: 1, tickTimeMs: 200 });
const sigkill = await benchSigkillFailover(process.env.ZK_CONNECT ?? zk!.connectString, 2000, 10).finally(() => zk?.stop());
say(
  "handover past a zombie's open transaction: `fencepost elect --proxy`, psycopg2 writers, the leader frozen between INSERT and COMMIT (about 16 s)",
);
const handover = await runHandoverBench({ rounds: 3 });

const a = proxy.find((r) => r.name.startsWith('(a)'))!;
const b = proxy.find((r) => r.name.startsWith('(b)'))!;
const fenced = proxy.find((r) => r.name === 'fenced PUT (proxy)')!;
const bound = election.crash.boundMs;
const out = [
  `Measured on: ${machine()}; ${new Date().toISOString().slice(0, 10)}. Load from autocannon in the bench process; each proxy a separate \`fencepost serve\` process; pool size 10.`,
  '',
  proxyTable(proxy),
  '',
  `Fenced PUT: ${fmt(fenced.rps / a.rps, 2)}× direct pg (target ≥ 0.6×), fence cost ${fmt(100 * (1 - fenced.rps / b.rps), 0)}% against the unfenced path (target ≤ 20%), p99 ${fmt(fenced.p99Ms, 1)} ms (target ≤ 10 ms).`,
  '',
  fenceKeyTables(fenceKey, durationS),
  '',
  httpFloorTable(floor, durationS),
  '',
  sqlEndpointTable(sqlEndpoint),
  '',
  cpuTable([...fenceKeyCpuRows(fenceKey), ...sqlEndpointCpuRows(sqlEndpoint), ...proxyCpuRows(proxy)], { pinnedCpus: pinnedDescription() }),
  '',
  soakTable(soak),
  '',
  protectedTable([...fenceKey.protected, ...sqlEndpoint.protected], durationS),
  '',
  raiseLatencyTable(raiseLatency),
  '',
  '| election (ms) | p50 | p99 | max | n | target |',
  '|---|---:|---:|---:|---:|---|',
  ...election.byCandidates.map((h) =>
    row(
      `graceful handover, ${h.candidates} candidates`,
      h.handoverMs,
      `${h.candidates === 2 ? 'p99 < 50' : 'flat in candidates'}${h.slow ? `; ${slowRounds(h)}` : ''}`,
    ),
  ),
  row(
    `crash failover (session abandoned), T = ${election.crash.sessionTimeoutMs}`,
    election.crash.failoverMs,
    `≤ ${bound} (T + tick + 200)`,
  ),
  row('crash failover (SIGKILL of `fencepost elect`), T = 2000', sigkill, `≤ ${bound}`),
  row(
    `freeze between INSERT and COMMIT → new leader's first COMMIT, T = ${handover.sessionTimeoutMs}${handover.zombieRefused ? '' : ' (ZOMBIE NOT REFUSED)'}`,
    handover.freezeToFirstWriteMs,
    `≤ ${handover.boundMs} (T + raise wait ${handover.raiseWaitMs} + 500); rounds over it: ${handover.overBound}, with a WAL or ZooKeeper fsync ≥ ${FSYNC_STALL_MS} ms: ${handover.overBoundDisk}`,
  ),
  row('doctor: ZooKeeper round trip', election.doctor.rttMs, ''),
  row('doctor: event-loop stall', election.doctor.eventLoopStallMs, `recommends T = ${election.doctor.recommendedSessionTimeoutMs}`),
];
process.stdout.write(out.join('\n') + '\n');
