// The fault schedule is a pure function of the seed: the same seed replays the same faults; and how
// the nemesis picks the writer a leader pause hits.
import { describe, expect, test } from 'vitest';
import {
  FAULT_KINDS,
  laneOf,
  planSchedule,
  runNemesis,
  type NemesisTarget,
  type PlannedFault,
  type ScheduleOptions,
} from '../../tools/chaos/nemesis.ts';
import type { Door } from '../../tools/chaos/history.ts';
import { Prng } from '../../tools/chaos/prng.ts';

const base: ScheduleOptions = {
  seed: 1,
  durationMs: 30_000,
  writers: 4,
  proxies: 2,
  zkServers: 3,
  fenceKeys: ['chaos/a', 'chaos/b'],
  sessionTimeoutMs: 2000,
};

describe('fault schedule', () => {
  test('the same seed gives the same schedule', () => {
    expect(planSchedule({ ...base, seed: 42 })).toEqual(planSchedule({ ...base, seed: 42 }));
  });

  test('different seeds give different schedules', () => {
    expect(planSchedule({ ...base, seed: 42 })).not.toEqual(planSchedule({ ...base, seed: 43 }));
  });

  test('a 30 s schedule holds every kind of fault, each within the run', () => {
    for (const seed of [1, 2, 3, 10, 1234]) {
      const s = planSchedule({ ...base, seed });
      expect(new Set(s.map((f) => f.kind))).toEqual(new Set(FAULT_KINDS));
      for (const f of s) expect(f.atMs).toBeGreaterThanOrEqual(1500);
      expect(s.map((f) => f.n)).toEqual(s.map((_, i) => i + 1));
    }
  });

  test('pauses and partitions outlast the session timeout (the writer must lose its session)', () => {
    const s = planSchedule({ ...base, seed: 7, durationMs: 120_000 });
    for (const f of s)
      if (f.kind === 'pause-writer' || f.kind === 'partition-writer') expect(f.durationMs).toBeGreaterThan(base.sessionTimeoutMs);
  });

  test('faults of one lane do not overlap: at most one writer and one component faulty at a time', () => {
    const s = planSchedule({ ...base, seed: 5, durationMs: 120_000 });
    for (const lane of ['writers', 'infrastructure'] as const) {
      const fs = s.filter((f) => laneOf(f.kind) === lane);
      for (let i = 1; i < fs.length; i++) {
        const prev = fs[i - 1]!;
        const busy = prev.kind === 'pause-writer' || prev.kind === 'partition-writer' ? prev.durationMs : prev.downMs;
        expect(fs[i]!.atMs).toBeGreaterThan(prev.atMs + busy);
      }
    }
  });

  test('only the requested kinds are drawn', () => {
    const s = planSchedule({ ...base, kinds: ['pause-writer'], gapMs: [300, 800] });
    expect(s.length).toBeGreaterThan(3);
    expect(new Set(s.map((f) => f.kind))).toEqual(new Set(['pause-writer']));
  });
});

test('the PRNG is mulberry32: fixed output for a fixed seed', () => {
  const r = new Prng(1);
  expect([r.next(), r.next(), r.next()].map((x) => x.toFixed(8))).toEqual(['0.62707394', '0.00273572', '0.52744704']);
});

test("a seed outside 0…2^32−1 is refused, not aliased to another seed's schedule", () => {
  expect(() => planSchedule({ ...base, seed: 2 ** 32 + 1 })).toThrow(RangeError);
  for (const seed of [-1, 1.5, Number.NaN]) expect(() => new Prng(seed)).toThrow(RangeError);
  expect(new Prng(2 ** 32 - 1).next()).toBeTypeOf('number');
});

describe('leader pauses take turns over the doors', () => {
  // Invariant: the n-th pause of a leader prefers a leader writing through sql, then tx, then http
  // (of any fence key), and falls back to the planned fence key's leader when none does.
  test('a SQL leader is paused first, then a /v1/transactions one (none: the planned leader), then an HTTP one', async () => {
    const doors: Door[] = ['http', 'sql', 'tx'];
    const paused: number[] = [];
    const target = {
      leaderOf: (k: string) => (k === 'a' ? 0 : 1),
      currentLeaders: () => [
        { fenceKey: 'a', slot: 0 },
        { fenceKey: 'b', slot: 1 },
      ],
      doorOf: (slot: number) => doors[slot]!,
      pauseWriter: async (slot: number) => void paused.push(slot),
      resumeWriter: () => {},
    } as unknown as NemesisTarget;
    const pause = (n: number): PlannedFault => ({
      n,
      atMs: 0,
      kind: 'pause-writer',
      target: { leaderOf: 'a', slot: 2 },
      durationMs: 1,
      midWrite: false,
    });
    const events = await runNemesis([pause(1), pause(2), pause(3)], target, { startedAt: Date.now() });
    expect(paused).toEqual([1, 0, 0]);
    expect(events.map((e) => e.target)).toEqual(['writer 2 (leader of b, sql door)', 'writer 1', 'writer 1 (leader of a, http door)']);
  });
});
