// The verdict of an HA run: what the two leaders were answered, against what the new primary holds
// afterwards. The fence survived the failover when
//   - every write answered 200 is on the new primary, with the token it was sent with;
//   - no write of token 1 sent after the raise to 2 was answered 200 (nor is it on the primary);
//   - the fence on the new primary is at 2, when it takes over and at the end;
//   - every answer is one the proxy may give: 200, 409 stale_token (token 1 only), 503;
//   - a 503 other than commit_unknown ("nothing committed, safe to retry") left nothing behind.
import type { WriteRecord } from './load.ts';

export type ViolationKind =
  'lost_write' | 'stale_accepted' | 'stale_committed' | 'fence_went_back' | 'unexpected_answer' | 'retry_safe_committed';

export interface Violation {
  kind: ViolationKind;
  detail: string;
}

export interface LeaderCounts {
  sent: number;
  accepted: number;
  stale: number;
  /** 503 answers by registry code. */
  unavailable: Record<string, number>;
  noAnswer: number;
  other: number;
  /** Committed (on the primary) without a 200: answered 503 commit_unknown, or not at all. */
  committedUnacknowledged: number;
}

export interface Verdict {
  violations: Violation[];
  leaders: Record<'1' | '2', LeaderCounts>;
}

export interface CheckInput {
  records: readonly WriteRecord[];
  /** When the raise to token 2 answered 200; null if it never did. */
  raiseAcknowledgedAt: number | null;
  /** Object key → token, as the new primary holds the run's objects. */
  stored: ReadonlyMap<string, bigint>;
  /** The fence's highest token on the new primary (null: no fence row). */
  finalFenceToken: bigint | null;
  /**
   * The same, read on the new primary the moment Patroni made it primary, before writes reach it
   * (undefined: not read). Below 2, the old leader could write again until the new one next wrote.
   */
  fenceAtTakeover?: bigint | null;
}

export function check(input: CheckInput): Verdict {
  const violations: Violation[] = [];
  const leaders = { '1': emptyCounts(), '2': emptyCounts() };
  const raisedAt = input.raiseAcknowledgedAt;
  if (raisedAt === null) violations.push({ kind: 'unexpected_answer', detail: 'the raise to token 2 was never answered 200' });
  for (const r of input.records) {
    const c = leaders[String(r.leader) as '1' | '2'];
    if (r.kind === 'write') c.sent++;
    if (r.status === null) {
      if (r.kind === 'write') c.noAnswer++;
    } else if (r.status === 200) {
      if (r.kind === 'write') c.accepted++;
    } else if (r.status === 409 && r.code === 'stale_token' && r.leader === 1) {
      c.stale++;
    } else if (r.status === 503) {
      const code = r.code ?? 'none';
      c.unavailable[code] = (c.unavailable[code] ?? 0) + 1;
    } else {
      c.other++;
      violations.push({
        kind: 'unexpected_answer',
        detail: `${r.kind} ${r.key} (token ${r.leader}) answered ${r.status} ${r.code ?? ''}`.trim(),
      });
    }
    if (r.kind !== 'write') continue;
    const stored = input.stored.get(r.key);
    if (r.status === 200 && stored !== BigInt(r.leader)) {
      violations.push({
        kind: 'lost_write',
        detail: `${r.key} (token ${r.leader}) was answered 200 at ${iso(r.answeredAt)} but ${stored === undefined ? 'is missing' : `holds token ${stored}`} on the new primary`,
      });
    }
    const afterRaise = raisedAt !== null && r.leader === 1 && r.sentAt > raisedAt;
    if (afterRaise && r.status === 200) {
      violations.push({
        kind: 'stale_accepted',
        detail: `${r.key} (token 1) sent ${r.sentAt - raisedAt} ms after the raise's 200 was answered 200`,
      });
    } else if (afterRaise && stored !== undefined) {
      violations.push({
        kind: 'stale_committed',
        detail: `${r.key} (token 1) sent ${r.sentAt - raisedAt} ms after the raise's 200 is on the new primary (answered ${r.status ?? 'nothing'})`,
      });
    }
    if (stored !== undefined && r.status !== 200) {
      c.committedUnacknowledged++;
      if (r.status === 503 && r.code !== 'commit_unknown') {
        violations.push({
          kind: 'retry_safe_committed',
          detail: `${r.key} (token ${r.leader}) was answered 503 ${r.code ?? ''} (nothing committed, safe to retry) but is on the new primary`,
        });
      }
    }
  }
  if (raisedAt !== null && input.fenceAtTakeover !== undefined && (input.fenceAtTakeover === null || input.fenceAtTakeover < 2n)) {
    violations.push({
      kind: 'fence_went_back',
      detail: `the new primary took over with the fence at ${input.fenceAtTakeover ?? 'nothing'}, below the raise's 2`,
    });
  }
  if (raisedAt !== null && (input.finalFenceToken === null || input.finalFenceToken < 2n)) {
    violations.push({
      kind: 'fence_went_back',
      detail: `the fence is at ${input.finalFenceToken ?? 'nothing'} on the new primary, below the raise's 2`,
    });
  }
  return { violations, leaders };
}

/** Violations counted by kind, with a few examples each, for a report. */
export function summarizeViolations(violations: readonly Violation[], examples = 3): string[] {
  const byKind = new Map<ViolationKind, Violation[]>();
  for (const v of violations) byKind.set(v.kind, [...(byKind.get(v.kind) ?? []), v]);
  const lines: string[] = [];
  for (const [kind, vs] of byKind) {
    lines.push(`${kind}: ${vs.length}`);
    for (const v of vs.slice(0, examples)) lines.push(`  ${v.detail}`);
  }
  return lines;
}

function emptyCounts(): LeaderCounts {
  return { sent: 0, accepted: 0, stale: 0, unavailable: {}, noAnswer: 0, other: 0, committedUnacknowledged: 0 };
}

function iso(ms: number): string {
  return new Date(ms).toISOString().slice(11, 23);
}
