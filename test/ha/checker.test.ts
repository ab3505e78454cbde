// The HA run's check (tools/ha/checker.ts) on hand-made histories: it passes a run where the fence
// held and names each way a failover can break it. (The run itself, `npm run ha`, also proves it
// on a real asynchronous failover; this keeps each rule covered in `npm test`.)
import { describe, expect, it } from 'vitest';
import { check, type CheckInput } from '../../tools/ha/checker.ts';
import type { WriteRecord } from '../../tools/ha/load.ts';

const RAISED_AT = 1_000;

function write(leader: 1 | 2, n: number, sentAt: number, status: number | null, code: string | null = null): WriteRecord {
  return { leader, kind: 'write', key: `ha/t/t${leader}/${n}`, sentAt, answeredAt: sentAt + 10, status, code };
}

/** A run where the fence held: token 1 accepted before the raise and refused after it, token 2 accepted. */
function heldRun(): CheckInput {
  const records: WriteRecord[] = [
    write(1, 1, 100, 200),
    { leader: 2, kind: 'raise', key: 'ha-t', sentAt: 990, answeredAt: RAISED_AT, status: 200, code: null },
    write(1, 2, 1_100, 409, 'stale_token'),
    write(2, 3, 1_200, 200),
    write(2, 4, 1_300, 503, 'unavailable'),
    write(2, 5, 1_400, 503, 'commit_unknown'),
    write(2, 6, 1_500, null),
  ];
  const stored = new Map<string, bigint>([
    ['ha/t/t1/1', 1n],
    ['ha/t/t2/3', 2n],
    ['ha/t/t2/5', 2n], // commit_unknown: it may have committed, and did
  ]);
  return { records, raiseAcknowledgedAt: RAISED_AT, stored, finalFenceToken: 2n };
}

const kinds = (input: CheckInput) => check(input).violations.map((v) => v.kind);

describe('the HA check', () => {
  it('passes a run where every 200 is on the new primary and token 1 was refused after the raise', () => {
    const verdict = check(heldRun());
    expect(verdict.violations).toEqual([]);
    expect(verdict.leaders['1']).toMatchObject({ sent: 2, accepted: 1, stale: 1 });
    expect(verdict.leaders['2']).toMatchObject({
      sent: 4,
      accepted: 1,
      unavailable: { unavailable: 1, commit_unknown: 1 },
      noAnswer: 1,
      committedUnacknowledged: 1,
    });
  });

  it('reports a write answered 200 that the new primary does not hold', () => {
    const run = heldRun();
    (run.stored as Map<string, bigint>).delete('ha/t/t2/3');
    expect(kinds(run)).toEqual(['lost_write']);
  });

  it('reports a token-1 write sent after the raise that was answered 200', () => {
    const run = heldRun();
    run.records = [...run.records, write(1, 7, 1_600, 200)];
    (run.stored as Map<string, bigint>).set('ha/t/t1/7', 1n);
    expect(kinds(run)).toEqual(['stale_accepted']);
  });

  it('reports a token-1 write sent after the raise that committed without a 200', () => {
    const run = heldRun();
    run.records = [...run.records, write(1, 7, 1_600, 503, 'commit_unknown')];
    (run.stored as Map<string, bigint>).set('ha/t/t1/7', 1n);
    expect(kinds(run)).toEqual(['stale_committed']);
  });

  it('accepts a token-1 write sent before the raise answered, whatever its answer came after', () => {
    const run = heldRun();
    run.records = [...run.records, { ...write(1, 7, 995, 200), answeredAt: 1_050 }];
    (run.stored as Map<string, bigint>).set('ha/t/t1/7', 1n);
    expect(kinds(run)).toEqual([]);
  });

  it('reports an answer the proxy must not give during a failover (500)', () => {
    const run = heldRun();
    run.records = [...run.records, write(2, 7, 1_600, 500, 'internal')];
    expect(kinds(run)).toEqual(['unexpected_answer']);
  });

  it('reports a 503 that said "safe to retry" whose write committed', () => {
    const run = heldRun();
    (run.stored as Map<string, bigint>).set('ha/t/t2/4', 2n);
    expect(kinds(run)).toEqual(['retry_safe_committed']);
  });

  it('reports a fence that went back below the raise', () => {
    expect(kinds({ ...heldRun(), finalFenceToken: 1n })).toEqual(['fence_went_back']);
  });

  it('reports a new primary that took over with the fence below the raise, though the new leader raised it again since', () => {
    expect(kinds({ ...heldRun(), fenceAtTakeover: 1n })).toEqual(['fence_went_back']);
    expect(kinds({ ...heldRun(), fenceAtTakeover: 2n })).toEqual([]);
  });
});
