// The chaos run's verdict: PASS only when nothing was violated and every fault that was started
// was applied; and `npm run chaos -- --help` prints usage instead of crashing.
import { expect, test } from 'vitest';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { planSchedule, type FaultEvent } from '../../tools/chaos/nemesis.ts';
import type { Operation } from '../../tools/chaos/history.ts';
import { verdictOf } from '../../tools/chaos/verdict.ts';
import { formatReport } from '../../tools/chaos/report.ts';
import { REPO } from '../support/proxy.ts';

const schedule = planSchedule({
  seed: 7,
  durationMs: 20_000,
  writers: 4,
  proxies: 2,
  zkServers: 3,
  fenceKeys: ['chaos/a'],
  sessionTimeoutMs: 2000,
});
const applied = (): FaultEvent[] =>
  schedule.map((f) => ({ n: f.n, kind: f.kind, target: 'x', plannedAtMs: f.atMs, startedAt: 0, endedAt: 1 }));
const acked = [{ outcome: 'ok' } as Operation];
const clean = { ok: true, violations: [] };

test('every planned fault applied and no violation: PASS, exit 0', () => {
  expect(schedule.length).toBeGreaterThan(2);
  expect(verdictOf({ check: clean, schedule, faults: applied(), ops: acked })).toEqual({
    outcome: 'pass',
    exitCode: 0,
    line: `PASS: no violations; ${schedule.length} of ${schedule.length} planned faults applied`,
  });
});

test('a planned fault that could not be applied fails the run, even with no violation, and the report ends so', () => {
  const faults = applied();
  const broken = faults[1]!;
  broken.error = 'postgres did not start within 30000 ms';
  const v = verdictOf({ check: clean, schedule, faults, ops: acked });
  expect(v.outcome).toBe('fail');
  expect(v.exitCode).toBe(1);
  expect(v.line).toBe(
    `FAIL: 1 of ${schedule.length} planned faults could not be applied (#${broken.n} ${broken.kind}: postgres did not start within 30000 ms)`,
  );
  const report = formatReport({
    seed: 7,
    loadMs: 20_000,
    fenceMode: 'strict',
    writers: 4,
    proxies: 2,
    ops: acked,
    faults,
    check: clean,
    verdict: v,
    dir: '/tmp/x',
  });
  expect(report).not.toContain('PASS');
  expect(report.split('\n').at(-1)).toBe(v.line);
});

test('violations and unapplied faults are both said', () => {
  const faults = applied();
  faults[0]!.error = 'no such writer';
  const v = verdictOf({
    check: { ok: false, violations: [{ invariant: 'monotonic', fenceKey: 'chaos/a', message: 'm', ops: [] }] },
    schedule,
    faults,
    ops: acked,
  });
  expect(v.line).toMatch(/^FAIL: 1 violations; 1 of \d+ planned faults could not be applied \(#1 /);
});

test('faults the load phase ended before are said, not failed; nothing written or nothing injected is INCONCLUSIVE (exit 3)', () => {
  const some = applied().slice(0, -1);
  expect(verdictOf({ check: clean, schedule, faults: some, ops: acked }).line).toBe(
    `PASS: no violations; ${schedule.length - 1} of ${schedule.length} planned faults applied, 1 not reached before the load phase ended`,
  );
  expect(verdictOf({ check: clean, schedule, faults: applied(), ops: [] })).toMatchObject({ outcome: 'inconclusive', exitCode: 3 });
  expect(verdictOf({ check: clean, schedule, faults: [], ops: acked })).toMatchObject({ outcome: 'inconclusive', exitCode: 3 });
});

test('npm run chaos -- --help prints usage and exits 0 without starting anything; an unknown flag exits 2 with it', () => {
  const chaos = (args: string[]) =>
    spawnSync(process.execPath, ['--import', 'tsx', join(REPO, 'scripts', 'chaos.ts'), ...args], {
      cwd: REPO,
      encoding: 'utf8',
      timeout: 30_000,
    });
  const help = chaos(['--help']);
  expect(help.status, help.stderr).toBe(0);
  expect(help.stdout).toMatch(/^usage: npm run chaos -- /);
  expect(help.stdout).toContain('--fuzz-sql');
  expect(help.stderr).not.toContain('ERR_PARSE_ARGS');
  const bad = chaos(['--no-such-flag']);
  expect(bad.status).toBe(2);
  expect(bad.stderr).toContain("chaos: Unknown option '--no-such-flag'");
  expect(bad.stderr).toContain('usage: npm run chaos -- ');
});
