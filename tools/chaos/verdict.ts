// What a chaos run shows, in one line and an exit code. No violation is evidence only if the run
// did what it planned: every fault that was started must have been applied (a restart that failed,
// a writer that could not be paused, leaves that part of the system untested), and something must
// have been written and broken.
//   FAIL (exit 1): a violation, or a planned fault that could not be applied
//   INCONCLUSIVE (exit 3): nothing acknowledged, or no fault injected at all
//   PASS (exit 0): otherwise. Faults the load phase ended before are said, not failed: the schedule
//   runs to the end of the load phase, and a lane held up by a long fault may not reach its last one.
import type { CheckResult } from './checker.ts';
import type { Operation } from './history.ts';
import type { FaultEvent, PlannedFault } from './nemesis.ts';

export interface Verdict {
  outcome: 'pass' | 'fail' | 'inconclusive';
  exitCode: 0 | 1 | 3;
  /** The report's last line, e.g. `PASS: no violations; 12 of 12 planned faults applied`. */
  line: string;
}

export interface VerdictInput {
  check: CheckResult;
  schedule: readonly PlannedFault[];
  faults: readonly FaultEvent[];
  ops: readonly Operation[];
}

export function verdictOf(r: VerdictInput): Verdict {
  const failed = r.faults.filter((f) => f.error !== undefined);
  const applied = r.faults.length - failed.length;
  const planned = r.schedule.length;
  const notReached = planned - r.faults.length;
  const faultsSaid = `${applied} of ${planned} planned faults applied${notReached > 0 ? `, ${notReached} not reached before the load phase ended` : ''}`;
  const problems: string[] = [];
  if (!r.check.ok) problems.push(`${r.check.violations.length} violations`);
  if (failed.length > 0) {
    const which = failed.map((f) => `#${f.n} ${f.kind}: ${f.error}`).join('; ');
    problems.push(`${failed.length} of ${planned} planned faults could not be applied (${which})`);
  }
  if (problems.length > 0) return { outcome: 'fail', exitCode: 1, line: `FAIL: ${problems.join('; ')}` };
  const acknowledged = r.ops.filter((op) => op.outcome === 'ok').length;
  if (acknowledged === 0 || (planned > 0 && applied === 0)) {
    return {
      outcome: 'inconclusive',
      exitCode: 3,
      line: `INCONCLUSIVE: no violations, but ${acknowledged} writes acknowledged, ${faultsSaid}`,
    };
  }
  return { outcome: 'pass', exitCode: 0, line: `PASS: no violations; ${faultsSaid}` };
}
