// The nemesis: a fault schedule drawn up front from a seed (so a seed replays the same schedule),
// and the loop that injects it into a running cluster. Faults run in two lanes, one at a time in
// each: writer faults (pause, kill, ZooKeeper partition of one writer) and infrastructure faults
// (restart one ZooKeeper server, one proxy instance, or Postgres). So at any moment at most one
// writer and one infrastructure component are faulty, and the system keeps making progress.
import { Prng } from './prng.ts';
import type { Door } from './history.ts';

export const WRITER_FAULTS = ['pause-writer', 'kill-writer', 'partition-writer'] as const;
export const INFRA_FAULTS = ['restart-zookeeper', 'restart-proxy', 'restart-postgres'] as const;
export const FAULT_KINDS = [...WRITER_FAULTS, ...INFRA_FAULTS] as const;
export type WriterFaultKind = (typeof WRITER_FAULTS)[number];
export type InfraFaultKind = (typeof INFRA_FAULTS)[number];
export type FaultKind = WriterFaultKind | InfraFaultKind;

/** Which writer a writer fault hits: the leader of a fence key when there is one (else `slot`), or a fixed slot. */
export type WriterTarget = { leaderOf: string; slot: number } | { leaderOf?: undefined; slot: number };

export type PlannedFault =
  | { n: number; atMs: number; kind: 'pause-writer'; target: WriterTarget; durationMs: number; midWrite: boolean }
  | { n: number; atMs: number; kind: 'partition-writer'; target: WriterTarget; durationMs: number }
  | { n: number; atMs: number; kind: 'kill-writer'; target: WriterTarget; downMs: number }
  | { n: number; atMs: number; kind: 'restart-zookeeper'; server: number; downMs: number }
  | { n: number; atMs: number; kind: 'restart-proxy'; proxy: number; signal: 'SIGTERM' | 'SIGKILL'; downMs: number }
  | { n: number; atMs: number; kind: 'restart-postgres'; crash: boolean; downMs: number };

export interface ScheduleOptions {
  seed: number;
  /** Length of the load phase; no fault starts so late that it would not end within it. */
  durationMs: number;
  writers: number;
  proxies: number;
  zkServers: number;
  fenceKeys: readonly string[];
  /** Writers' ZooKeeper session timeout: pauses and partitions outlast it. */
  sessionTimeoutMs: number;
  /** Kinds to draw from; default all. */
  kinds?: readonly FaultKind[];
  /** No fault before this. Default 1500 ms. */
  warmupMs?: number;
  /** Quiet time between two faults of a lane, [min, max]. Default [500, 2000] ms. */
  gapMs?: readonly [number, number];
  /** Chance that a writer fault targets a fence key's current leader (the interesting writer). Default 0.75. */
  leaderBias?: number;
  /**
   * Chance that a pause lands mid-write (between taking the token and sending, like a GC pause
   * while the writer runs) rather than at a random moment (mostly idle). Default 0.75.
   */
  midWriteBias?: number;
}

/** How long a fault is expected to keep its lane busy: used to space the schedule, not to time it. */
function estimatedMs(f: PlannedFault): number {
  switch (f.kind) {
    case 'pause-writer':
    case 'partition-writer':
      return f.durationMs;
    case 'kill-writer':
      return f.downMs + 1500;
    case 'restart-zookeeper':
      return f.downMs + 3000;
    case 'restart-proxy':
      return f.downMs + 1500;
    case 'restart-postgres':
      return f.downMs + 2500;
  }
}

/** The fault schedule for a seed: a pure function of its options. */
export function planSchedule(o: ScheduleOptions): PlannedFault[] {
  const rng = new Prng(o.seed);
  const kinds = o.kinds ?? FAULT_KINDS;
  const [gapMin, gapMax] = o.gapMs ?? [500, 2000];
  const bias = o.leaderBias ?? 0.75;
  const planned: Omit<PlannedFault, 'n'>[] = [];
  const writerTarget = (): WriterTarget => {
    const slot = rng.int(0, o.writers - 1);
    return rng.next() < bias && o.fenceKeys.length > 0 ? { leaderOf: rng.pick(o.fenceKeys), slot } : { slot };
  };
  const draw = (kind: FaultKind, atMs: number): PlannedFault => {
    const st = o.sessionTimeoutMs;
    switch (kind) {
      case 'pause-writer':
        return {
          n: 0,
          atMs,
          kind,
          target: writerTarget(),
          durationMs: rng.int(Math.round(st * 1.5), Math.round(st * 2.5)),
          midWrite: rng.next() < (o.midWriteBias ?? 0.75),
        };
      case 'partition-writer':
        return { n: 0, atMs, kind, target: writerTarget(), durationMs: rng.int(Math.round(st * 1.5), Math.round(st * 2.5)) };
      case 'kill-writer':
        return { n: 0, atMs, kind, target: writerTarget(), downMs: rng.int(300, 1500) };
      case 'restart-zookeeper':
        return { n: 0, atMs, kind, server: rng.int(1, o.zkServers), downMs: rng.int(0, 1000) };
      case 'restart-proxy':
        return {
          n: 0,
          atMs,
          kind,
          proxy: rng.int(0, o.proxies - 1),
          signal: rng.next() < 0.5 ? 'SIGTERM' : 'SIGKILL',
          downMs: rng.int(200, 1500),
        };
      case 'restart-postgres':
        return { n: 0, atMs, kind, crash: rng.next() < 0.5, downMs: rng.int(200, 1500) };
    }
  };
  // Each lane cycles through its kinds in a fresh seeded order, so a short run still sees every kind.
  for (const lane of [WRITER_FAULTS, INFRA_FAULTS] as readonly (readonly FaultKind[])[]) {
    const laneKinds = lane.filter((k) => kinds.includes(k));
    if (laneKinds.length === 0) continue;
    let order: FaultKind[] = [];
    let t = (o.warmupMs ?? 1500) + rng.int(0, gapMin);
    for (;;) {
      if (order.length === 0) order = rng.shuffle(laneKinds);
      const f = draw(order.shift()!, t);
      if (t + estimatedMs(f) > o.durationMs) break;
      planned.push(f);
      t += estimatedMs(f) + rng.int(gapMin, gapMax);
    }
  }
  return planned.sort((a, b) => a.atMs - b.atMs).map((f, i) => ({ ...f, n: i + 1 }) as PlannedFault);
}

export function laneOf(kind: FaultKind): 'writers' | 'infrastructure' {
  return (WRITER_FAULTS as readonly string[]).includes(kind) ? 'writers' : 'infrastructure';
}

/** One line per fault, for printing and for `schedule.txt`. */
export function describeFault(f: PlannedFault): string {
  const at = `+${(f.atMs / 1000).toFixed(1)}s`.padStart(7);
  const who = (t: WriterTarget) =>
    t.leaderOf !== undefined ? `leader of ${t.leaderOf} (else writer ${t.slot + 1})` : `writer ${t.slot + 1}`;
  switch (f.kind) {
    case 'pause-writer':
      return `${at} #${f.n} SIGSTOP ${who(f.target)}${f.midWrite ? ' mid-write' : ''} for ${f.durationMs} ms`;
    case 'partition-writer':
      return `${at} #${f.n} cut ZooKeeper from ${who(f.target)} for ${f.durationMs} ms`;
    case 'kill-writer':
      return `${at} #${f.n} SIGKILL ${who(f.target)}, restart after ${f.downMs} ms`;
    case 'restart-zookeeper':
      return `${at} #${f.n} restart ZooKeeper server ${f.server} (down ${f.downMs} ms)`;
    case 'restart-proxy':
      return `${at} #${f.n} ${f.signal} proxy ${f.proxy + 1}, restart after ${f.downMs} ms`;
    case 'restart-postgres':
      return `${at} #${f.n} ${f.crash ? 'crash Postgres (SIGQUIT: no checkpoint, WAL recovery on restart)' : 'restart Postgres'} (down ${f.downMs} ms)`;
  }
}

/** What the nemesis needs from the cluster. Writer slots are 0-based. */
export interface NemesisTarget {
  leaderOf(fenceKey: string): number | null;
  /** The current leader of every fence key that has one. */
  currentLeaders(): { fenceKey: string; slot: number }[];
  /** The door a writer slot writes through. */
  doorOf(slot: number): Door;
  /** SIGSTOP; with `midWrite`, at the writer's next write (between taking its token and sending). */
  pauseWriter(slot: number, midWrite: boolean): Promise<void>;
  resumeWriter(slot: number): void;
  killWriter(slot: number): Promise<void>;
  startWriter(slot: number): Promise<void>;
  partitionWriter(slot: number): void;
  healWriter(slot: number): void;
  stopZooKeeper(server: number): Promise<void>;
  startZooKeeper(server: number): Promise<void>;
  stopProxy(index: number, signal: NodeJS.Signals): Promise<void>;
  startProxy(index: number): Promise<void>;
  stopPostgres(crash?: boolean): Promise<void>;
  startPostgres(): Promise<void>;
}

/** A fault as it happened. */
export interface FaultEvent {
  n: number;
  kind: FaultKind;
  /** What was hit, resolved at injection time (e.g. `writer 3`, `zk 2`, `proxy 1`, `postgres`). */
  target: string;
  plannedAtMs: number;
  startedAt: number;
  endedAt: number;
  error?: string;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Injects the schedule, each lane in order; a fault that is late (its lane still busy) starts at
 * once. Stops starting faults when `signal` aborts, but always heals the one in progress.
 */
export async function runNemesis(
  schedule: readonly PlannedFault[],
  target: NemesisTarget,
  o: { startedAt: number; signal?: AbortSignal; onFault?: (e: FaultEvent) => void },
): Promise<FaultEvent[]> {
  const events: FaultEvent[] = [];
  // Pauses of a leader take turns over the doors: the n-th prefers a leader that writes through
  // PAUSE_DOORS[n % 3] (of any fence key), so a short run also pauses SQL and /v1/transactions
  // writers into zombies, not only whichever door happens to lead the planned key.
  let pauses = 0;
  const preferDoor = (): Door => PAUSE_DOORS[pauses++ % PAUSE_DOORS.length]!;
  const lane = async (faults: readonly PlannedFault[]) => {
    for (const f of faults) {
      const wait = o.startedAt + f.atMs - Date.now();
      if (wait > 0) await abortableSleep(wait, o.signal);
      if (o.signal?.aborted) return;
      const startedAt = Date.now();
      let what = '?';
      let error: string | undefined;
      try {
        what = await inject(f, target, f.kind === 'pause-writer' && f.target.leaderOf !== undefined ? preferDoor() : null);
      } catch (err) {
        error = err instanceof Error ? err.message : String(err);
      }
      const e: FaultEvent = {
        n: f.n,
        kind: f.kind,
        target: what,
        plannedAtMs: f.atMs,
        startedAt,
        endedAt: Date.now(),
        ...(error ? { error } : {}),
      };
      events.push(e);
      o.onFault?.(e);
    }
  };
  await Promise.all([
    lane(schedule.filter((f) => laneOf(f.kind) === 'writers')),
    lane(schedule.filter((f) => laneOf(f.kind) === 'infrastructure')),
  ]);
  return events.sort((a, b) => a.n - b.n);
}

/** The order in which leader pauses prefer doors (see runNemesis). */
const PAUSE_DOORS: readonly Door[] = ['sql', 'tx', 'http'];

async function inject(f: PlannedFault, t: NemesisTarget, door: Door | null): Promise<string> {
  const slotOf = (w: WriterTarget) => (w.leaderOf !== undefined ? (t.leaderOf(w.leaderOf) ?? w.slot) : w.slot);
  switch (f.kind) {
    case 'pause-writer': {
      const preferred = door === null ? undefined : t.currentLeaders().find((l) => t.doorOf(l.slot) === door);
      const slot = preferred?.slot ?? slotOf(f.target);
      await t.pauseWriter(slot, f.midWrite);
      try {
        await sleep(f.durationMs);
      } finally {
        t.resumeWriter(slot);
      }
      return preferred ? `writer ${slot + 1} (leader of ${preferred.fenceKey}, ${door} door)` : `writer ${slot + 1}`;
    }
    case 'partition-writer': {
      const slot = slotOf(f.target);
      t.partitionWriter(slot);
      try {
        await sleep(f.durationMs);
      } finally {
        t.healWriter(slot);
      }
      return `writer ${slot + 1}`;
    }
    case 'kill-writer': {
      const slot = slotOf(f.target);
      await t.killWriter(slot);
      await sleep(f.downMs);
      await t.startWriter(slot);
      return `writer ${slot + 1}`;
    }
    case 'restart-zookeeper':
      await t.stopZooKeeper(f.server);
      await sleep(f.downMs);
      await t.startZooKeeper(f.server);
      return `zookeeper ${f.server}`;
    case 'restart-proxy':
      await t.stopProxy(f.proxy, f.signal);
      await sleep(f.downMs);
      await t.startProxy(f.proxy);
      return `proxy ${f.proxy + 1}`;
    case 'restart-postgres':
      await t.stopPostgres(f.crash);
      await sleep(f.downMs);
      await t.startPostgres();
      return 'postgres';
  }
}

function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (!signal) return sleep(ms);
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal!.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}
