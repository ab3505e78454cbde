// CPU per operation per process, from /proc: what a write costs Postgres, the proxy, PgBouncer and
// the load generator, each apart (utime + stime, in clock ticks of `getconf CLK_TCK`), over the
// measured seconds only: a reading right before the measured run (after its warm-up) and one right
// after it. Throughput on a box where all of them share the cores mixes "how much database does
// the fence cost" with "how many cores does the proxy need"; this splits them.
//
// A part is a process tree: its root and every live descendant, each with its own time and that of
// its children it has reaped (cutime + cstime). A child that exits during the run moves its time
// into its parent's cumulative figure, so backends that come and go are counted too. Postgres is
// the postmaster's tree (found from a backend's parent pid, so a local DATABASE_URL server works
// too); the load generators the bench spawns and waits for (pgbench, wrk) are counted through the
// bench process's own reaped children (nothing else of the bench's exits during a measured run);
// a load generator inside the bench process (autocannon, node-postgres) is the bench process itself.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import pg from 'pg';
import { fmt } from './support.ts';

const CLK_TCK = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();
const US_PER_TICK = 1e6 / CLK_TCK;

/** The processes a row's CPU is split into. */
export const CPU_PARTS = ['postgres', 'proxy', 'pgbouncer', 'loadgen'] as const;
export type CpuPart = (typeof CPU_PARTS)[number];
const PART_NAMES: Record<CpuPart, string> = { postgres: 'Postgres', proxy: 'proxy', pgbouncer: 'PgBouncer', loadgen: 'load gen' };

interface Stat {
  ppid: number;
  /** utime + stime, ticks. */
  own: number;
  /** cutime + cstime: reaped children, ticks. */
  reaped: number;
}

/** /proc/<pid>/stat, or null when the process is gone (or not visible here: a remote server). */
function readStat(pid: number): Stat | null {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  // Fields after the command name (which may hold spaces and parentheses): state is field 3.
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  const n = (field: number) => Number(f[field - 3]);
  return { ppid: n(4), own: n(14) + n(15), reaped: n(16) + n(17) };
}

/** Every process's parent, scanned from /proc (this kernel has no /proc/<pid>/task/<tid>/children). */
function parents(): Map<number, number> {
  const out = new Map<number, number>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const s = readStat(Number(name));
    if (s) out.set(Number(name), s.ppid);
  }
  return out;
}

/** `root` and its live descendants. */
export function processTree(root: number): number[] {
  const byParent = new Map<number, number[]>();
  for (const [pid, ppid] of parents()) byParent.set(ppid, [...(byParent.get(ppid) ?? []), pid]);
  const out: number[] = [];
  const walk = (pid: number) => {
    out.push(pid);
    for (const c of byParent.get(pid) ?? []) walk(c);
  };
  walk(root);
  return out;
}

/** A part's CPU so far, µs; null when it cannot be read (its root gone or not on this machine). */
export interface CpuProbe {
  part: CpuPart;
  read(): number | null;
}

/**
 * A process tree's CPU: every live member's own time and what it has reaped (a zombie still shows
 * its own). Read again when a member was reaped while it was being read (it would count in neither
 * place: at the end of a pgbench run its 16 backends exit just then).
 */
export function treeProbe(part: CpuPart, root: number): CpuProbe {
  const once = (): { ticks: number; settled: boolean } | null => {
    const pids = processTree(root);
    const first = pids.map(readStat);
    if (first[0] === null || first[0] === undefined) return null;
    const again = pids.map(readStat);
    const settled = first.every((s, i) => s !== null && again[i] !== null && s.reaped === again[i]!.reaped);
    return { ticks: first.reduce((sum, s) => sum + (s ? s.own + s.reaped : 0), 0), settled };
  };
  return {
    part,
    read: () => {
      let r = once();
      for (let i = 0; r !== null && !r.settled && i < 50; i++) r = once();
      return r === null ? null : r.ticks * US_PER_TICK;
    },
  };
}

/** Load generators the bench process spawns and waits for within the run: its reaped children. */
export function exitedChildrenProbe(): CpuProbe {
  return { part: 'loadgen', read: () => (readStat(process.pid)?.reaped ?? 0) * US_PER_TICK };
}

/** A load generator inside the bench process (autocannon, node-postgres): all of its threads. */
export function selfProbe(): CpuProbe {
  return {
    part: 'loadgen',
    read: () => {
      const u = process.cpuUsage();
      return u.user + u.system;
    },
  };
}

/** The postmaster of the server at `url`: the parent of a backend, if that server runs on this machine. */
export async function postmasterPid(url: string): Promise<number | null> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const { rows } = await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    const backend = readStat(rows[0]!.pid);
    if (backend === null) return null; // not on this machine (or another pid namespace)
    const comm = readFileSync(`/proc/${backend.ppid}/comm`, 'utf8').trim();
    return comm.startsWith('postgres') ? backend.ppid : null;
  } finally {
    await c.end();
  }
}

/** A child of this process running `comm` (e.g. the PgBouncer tools/pgbouncer.ts started), newest first. */
export function childNamed(comm: string): number | null {
  const mine = [...parents()].filter(([, ppid]) => ppid === process.pid).map(([pid]) => pid);
  const named = mine.filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === comm;
    } catch {
      return false;
    }
  });
  return named.sort((a, b) => b - a)[0] ?? null;
}

/** CPU over one measured window, µs per part (absent: not measured, or not readable). */
export interface CpuWindow {
  seconds: number;
  us: Partial<Record<CpuPart, number>>;
}

/** Reads every probe, runs `body`, reads them again. Several probes of one part add up. */
export async function measureCpu<T>(probes: readonly CpuProbe[], body: () => Promise<T>): Promise<{ result: T; cpu: CpuWindow }> {
  const before = probes.map((p) => p.read());
  const t = process.hrtime.bigint();
  const result = await body();
  const seconds = Number(process.hrtime.bigint() - t) / 1e9;
  const after = probes.map((p) => p.read());
  const us: Partial<Record<CpuPart, number>> = {};
  probes.forEach((p, i) => {
    const [a, b] = [before[i], after[i]];
    if (a === null || a === undefined || b === null || b === undefined) return;
    us[p.part] = (us[p.part] ?? 0) + (b - a);
  });
  return { result, cpu: { seconds, us } };
}

// ---- the table ---------------------------------------------------------------------------------

/** Where the processes ran: sharing every core, or Postgres on one core and the rest on the others (bench/placement.ts). */
export type Placement = 'shared' | 'pinned';

/**
 * A goal on a part's CPU per operation: at most `maxUs`, or at most `maxRatio` × the direct row's
 * (`against`: the row of that path instead, in the same scenario and placement).
 */
export interface CpuGoal {
  part: CpuPart;
  maxUs?: number;
  maxRatio?: number;
  against?: { path: string; name: string };
}

/** One measured run: its rate and latency, and its CPU split by process. */
export interface CpuRow {
  /** Rows of one scenario and placement are compared with the scenario's direct row. */
  scenario: string;
  path: string;
  /** The row the scenario's other rows are divided by. */
  direct: boolean;
  placement: Placement;
  perS: number;
  p50Ms: number;
  p99Ms: number;
  /** Operations (transactions, requests) in the window. */
  ops: number;
  failed: number;
  cpu: CpuWindow;
  goals?: readonly CpuGoal[];
}

const perOp = (r: CpuRow, part: CpuPart): number | undefined => {
  const us = r.cpu.us[part];
  return us === undefined || r.ops === 0 ? undefined : us / r.ops;
};
const total = (r: CpuRow): number | undefined => {
  const parts = CPU_PARTS.filter((p) => r.cpu.us[p] !== undefined);
  return parts.length === 0 || r.ops === 0 ? undefined : parts.reduce((s, p) => s + r.cpu.us[p]!, 0) / r.ops;
};

function goalText(g: CpuGoal, r: CpuRow, rows: readonly CpuRow[], direct: CpuRow | undefined): string {
  const mine = perOp(r, g.part);
  const name = PART_NAMES[g.part];
  if (g.maxUs !== undefined) return `${name} ≤ ${g.maxUs} µs: ${mine === undefined ? '–' : mine <= g.maxUs ? 'yes' : '**no**'}`;
  const against =
    g.against === undefined
      ? direct
      : rows.find((x) => x.path === g.against!.path && x.scenario === r.scenario && x.placement === r.placement);
  const base = against ? perOp(against, g.part) : undefined;
  const ratio = mine !== undefined && base !== undefined ? mine / base : undefined;
  return `${name} ≤ ${g.maxRatio}× ${g.against?.name ?? 'direct'}: ${ratio === undefined ? '–' : `${fmt(ratio, 2)}×, ${ratio <= g.maxRatio! ? 'yes' : '**no**'}`}`;
}

/**
 * The CPU table: one row per run, grouped by scenario and placement; µs of CPU per operation for
 * each process (with the cores it kept busy over the window), Postgres's and the sum's ratio to the
 * scenario's direct row in the same placement.
 */
export function cpuTable(rows: readonly CpuRow[], notes: { pinnedCpus?: string } = {}): string {
  if (rows.length === 0) return '';
  const pinned = notes.pinnedCpus ? ` \`pinned\`: ${notes.pinnedCpus}.` : '';
  const out = [
    `CPU per operation, by process: utime + stime from /proc over the measured seconds only (read after the warm-up and at the end; CLK_TCK ${CLK_TCK}), divided by the operations in that window; in brackets the cores that process kept busy. Postgres is the postmaster and all its children (backends that exited during the run included); the load generator is pgbench or wrk (their own processes) or the bench process itself (autocannon, node-postgres). \`shared\`: every process on every core.${pinned} × direct: the same scenario's direct row in the same placement.`,
    '',
    '| scenario | path | placement | op/s | × direct | p50 / p99 ms | Postgres µs/op | × direct | proxy µs/op | PgBouncer µs/op | load gen µs/op | all µs/op | × direct | goals | failed |',
    '|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|',
  ];
  const cell = (r: CpuRow, part: CpuPart) => {
    const us = perOp(r, part);
    return us === undefined ? '–' : `${fmt(us, 1)} (${fmt(r.cpu.us[part]! / 1e6 / r.cpu.seconds, 2)})`;
  };
  const ratio = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined ? '–' : `${fmt(a / b, 2)}×`);
  for (const r of rows) {
    const direct = rows.find((x) => x.direct && x.scenario === r.scenario && x.placement === r.placement);
    const d = direct && direct !== r ? direct : undefined;
    out.push(
      [
        '',
        r.scenario,
        r.path,
        r.placement,
        fmt(r.perS, 0),
        r.direct ? '1×' : d ? `${fmt(r.perS / d.perS, 2)}×` : '–',
        `${fmt(r.p50Ms, 2)} / ${fmt(r.p99Ms, 2)}`,
        cell(r, 'postgres'),
        r.direct ? '1×' : ratio(perOp(r, 'postgres'), d && perOp(d, 'postgres')),
        cell(r, 'proxy'),
        cell(r, 'pgbouncer'),
        cell(r, 'loadgen'),
        total(r) === undefined ? '–' : fmt(total(r)!, 1),
        r.direct ? '1×' : ratio(total(r), d && total(d)),
        (r.goals ?? []).map((g) => goalText(g, r, rows, d)).join('; '),
        String(r.failed),
        '',
      ]
        .join(' | ')
        .trim(),
    );
  }
  return out.join('\n');
}
