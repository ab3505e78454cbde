// Where a measured run's processes run (taskset, util-linux): `shared`, every process on every core
// the bench may use, or `pinned`, Postgres on one core and everything else (the bench process and
// the load generators it spawns, the proxy, PgBouncer) on the others: the closest one box gets to
// a database machine and a proxy machine. Postgres is pinned after start: the postmaster and every
// live child (taskset -a -p, all threads); backends forked later inherit the postmaster's
// affinity. A load generator spawned after the placement inherits the bench process's.
// BENCH_PLACEMENT = both (default) | shared | pinned.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { processTree, type Placement } from './cpu.ts';

export type { Placement } from './cpu.ts';

/** A process's cores (Cpus_allowed_list: "0-1", "0,2-3"), e.g. [0, 1]. */
function cpusAllowed(pid: number | 'self'): number[] {
  const m = /^Cpus_allowed_list:\s*(\S+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  const out: number[] = [];
  for (const range of (m?.[1] ?? '').split(',').filter(Boolean)) {
    const [a, b] = range.split('-').map(Number);
    for (let c = a!; c <= (b ?? a!); c++) out.push(c);
  }
  return out;
}

/** The cores the bench started with (its affinity). */
const START_CPUS: readonly number[] = cpusAllowed('self');

const list = (cpus: readonly number[]) => cpus.join(',');

/** What each side gets when pinned: the first core for Postgres, the rest for everything else. */
export const PINNED = { postgres: list(START_CPUS.slice(0, 1)), others: list(START_CPUS.slice(1)) };

/** "Postgres on core 0, everything else on core 1", for the report. */
export function pinnedDescription(): string {
  return `Postgres (postmaster and all its processes) on core ${PINNED.postgres}, everything else (bench process, load generator, proxy, PgBouncer) on core${START_CPUS.length > 2 ? 's' : ''} ${PINNED.others}`;
}

/** The placements to run, from BENCH_PLACEMENT; `pinned` needs two cores at least. */
export function placements(): Placement[] {
  const asked = process.env.BENCH_PLACEMENT ?? 'both';
  const all: Placement[] = asked === 'both' ? ['shared', 'pinned'] : asked === 'shared' || asked === 'pinned' ? [asked] : [];
  if (all.length === 0) throw new Error(`BENCH_PLACEMENT must be both, shared or pinned (got ${JSON.stringify(asked)})`);
  if (START_CPUS.length < 2) {
    if (asked === 'pinned') throw new Error(`BENCH_PLACEMENT=pinned needs two cores; this process may use ${list(START_CPUS)}`);
    return ['shared'];
  }
  return all;
}

/** `taskset -a -p -c cpus pid`: every thread of the process. False when it is gone (a backend that just exited). */
function setAffinity(pid: number, cpus: string): boolean {
  const r = spawnSync('taskset', ['-a', '-p', '-c', cpus, String(pid)], { encoding: 'utf8' });
  if (r.error) throw new Error('cannot run taskset (util-linux)', { cause: r.error });
  return r.status === 0;
}

/** The processes a placement moves. */
export interface Placed {
  /** The postmaster (cpu.ts postmasterPid); null: a server elsewhere, left alone. */
  postgres: number | null;
  /** The proxy, PgBouncer: each with all of its threads (not its children). */
  others: readonly number[];
}

/**
 * Moves the processes to `placement` and checks the roots took it. The bench process is moved too
 * (all threads): it is the in-process load generator and the parent of the ones it spawns. Call it
 * before every measured run (and its warm-up): a process started since the last call (a new
 * Postgres, a new proxy) has whatever the bench process had when it was spawned.
 */
export function place(placement: Placement, p: Placed): void {
  const all = list(START_CPUS);
  const [pgCpus, otherCpus] = placement === 'pinned' ? [PINNED.postgres, PINNED.others] : [all, all];
  const check = (pid: number, cpus: string) => {
    if (!setAffinity(pid, cpus)) throw new Error(`taskset could not move process ${pid} to cores ${cpus}`);
    const now = list(cpusAllowed(pid));
    if (now !== cpus) throw new Error(`process ${pid} runs on cores ${now}, not ${cpus}`);
  };
  if (p.postgres !== null) {
    check(p.postgres, pgCpus);
    for (const pid of processTree(p.postgres).slice(1)) setAffinity(pid, pgCpus);
  }
  for (const pid of [process.pid, ...p.others]) check(pid, otherCpus);
}
