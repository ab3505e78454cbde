// The chaos checker on handcrafted histories: a clean history passes, and each invariant catches
// the bug it is meant to catch.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, test } from 'vitest';
import { check, type FinalState, type Invariant, type StoredObject } from '../../tools/chaos/checker.ts';
import { readHistory, type Operation } from '../../tools/chaos/history.ts';

const FK = 'chaos/a';
const LEDGER = `${FK}/ledger`;
let clock = 1000;

/** An operation; sendT/ackT default to a fresh, strictly later pair of times. */
function op(p: Partial<Operation> & Pick<Operation, 'op' | 'writer' | 'kind' | 'token'>): Operation {
  const sendT = p.sendT ?? (clock += 10);
  const key = p.key !== undefined ? p.key : p.kind === 'ledger' ? LEDGER : p.kind === 'object' ? `${FK}/${p.writer}/${p.op}` : null;
  return {
    fenceKey: FK,
    key,
    body: p.kind === 'fence' ? null : `{"op":"${p.op}"}`,
    proxy: 'http://proxy-1',
    sendT,
    ackT: sendT + 5,
    outcome: 'ok',
    status: 200,
    version: null,
    highestToken: null,
    error: null,
    ...p,
    token: p.token,
  } as Operation;
}

/** The database state a correct system would leave for `ops`: ok writes stored, the ledger at its last acknowledged version. */
function finalFor(ops: Operation[], over: { objects?: [string, StoredObject | null][]; stats?: FinalState['stats'] } = {}): FinalState {
  const objects = new Map<string, StoredObject>();
  for (const o of ops) if (o.outcome === 'ok' && o.kind === 'object') objects.set(o.key!, { body: o.body!, token: o.token, version: 1 });
  const ledger = ops
    .filter((o) => o.kind === 'ledger' && o.outcome === 'ok')
    .sort((a, b) => a.version! - b.version!)
    .at(-1);
  if (ledger) objects.set(LEDGER, { body: ledger.body!, token: ledger.token, version: ledger.version! });
  for (const [k, v] of over.objects ?? []) {
    if (v) objects.set(k, v);
    else objects.delete(k);
  }
  const accepted = ops.filter((o) => o.outcome === 'ok').length;
  const rejected = ops.filter((o) => o.outcome === 'rejected').length;
  return { objects, stats: over.stats ?? { accepted, rejected, byFenceKey: [{ fenceKey: FK, accepted, rejected }] } };
}

const invariants = (ops: Operation[], final = finalFor(ops)): Invariant[] =>
  [...new Set(check(ops, final).violations.map((v) => v.invariant))].sort();

/** Leader w1 (token 1) writes, w2 takes over with token 2, the zombie w1 is refused. */
function cleanHistory(): Operation[] {
  return [
    op({ op: 'a1', writer: 'w1', kind: 'fence', token: 1n }),
    op({ op: 'a2', writer: 'w1', kind: 'object', token: 1n, version: 1 }),
    op({ op: 'a3', writer: 'w1', kind: 'ledger', token: 1n, version: 1 }),
    op({ op: 'b1', writer: 'w2', kind: 'fence', token: 2n }),
    op({ op: 'b2', writer: 'w2', kind: 'ledger', token: 2n, version: 2 }),
    op({ op: 'a4', writer: 'w1', kind: 'object', token: 1n, outcome: 'rejected', status: 409, highestToken: 2n }),
    op({ op: 'b3', writer: 'w2', kind: 'object', token: 2n, version: 1 }),
    op({ op: 'b4', writer: 'w2', kind: 'ledger', token: 2n, version: 3 }),
  ];
}

describe('a correct history', () => {
  test('passes every invariant', () => {
    const ops = cleanHistory();
    expect(check(ops, finalFor(ops))).toEqual({ ok: true, violations: [] });
  });

  test('a stale write sent before the newer token was acknowledged may commit (it raced, it was not stale yet)', () => {
    const ops = cleanHistory();
    // w1's write leaves before b1's ack and commits before it: real-time order allows it.
    const b1 = ops.find((o) => o.op === 'b1')!;
    ops.push(op({ op: 'a5', writer: 'w1', kind: 'object', token: 1n, version: 1, sendT: b1.ackT! - 1, ackT: b1.ackT! + 50 }));
    expect(invariants(ops)).toEqual([]);
  });

  test('indeterminate writes may be committed or not, and widen the stats range', () => {
    const ops = cleanHistory();
    ops.push(op({ op: 'b5', writer: 'w2', kind: 'object', token: 2n, outcome: 'indeterminate', status: 503, ackT: null }));
    ops.push(op({ op: 'b6', writer: 'w2', kind: 'ledger', token: 2n, outcome: 'indeterminate', status: null, ackT: null }));
    ops.push(op({ op: 'b7', writer: 'w2', kind: 'object', token: 2n, outcome: 'indeterminate', status: null, ackT: null }));
    const base = finalFor(ops);
    // b5 committed, b7 did not; the ledger took b6 as version 4; stats count one of the two.
    const committed = finalFor(ops, {
      objects: [
        [ops.find((o) => o.op === 'b5')!.key!, { body: '{"op":"b5"}', token: 2n, version: 1 }],
        [LEDGER, { body: '{"op":"b6"}', token: 2n, version: 4 }],
      ],
      stats: {
        accepted: base.stats.accepted + 2,
        rejected: 1,
        byFenceKey: [{ fenceKey: FK, accepted: base.stats.accepted + 2, rejected: 1 }],
      },
    });
    expect(check(ops, committed).violations).toEqual([]);
    expect(check(ops, base).violations).toEqual([]);
  });
});

describe('invariant 1: accepted tokens never decrease', () => {
  test('catches a lower token after a higher one in commit order (ledger versions)', () => {
    const ops = cleanHistory();
    // The zombie's ledger write left before token 2 was acknowledged (so real time cannot tell),
    // but committed as version 4, after token 2's version 3.
    const [b1, b4] = [ops.find((o) => o.op === 'b1')!, ops.find((o) => o.op === 'b4')!];
    ops.push(op({ op: 'a5', writer: 'w1', kind: 'ledger', token: 1n, version: 4, sendT: b1.sendT, ackT: b4.ackT! + 1 }));
    const v = check(ops, finalFor(ops)).violations.filter((x) => x.invariant === 'monotonic');
    expect(v).toHaveLength(1);
    expect(v[0]!.message).toContain('commit order');
    expect(v[0]!.ops).toEqual(['b4', 'a5']);
  });

  test('catches a write accepted with a token below one acknowledged before it was sent (real time)', () => {
    const ops = cleanHistory();
    ops.push(op({ op: 'a5', writer: 'w1', kind: 'object', token: 1n, version: 1 })); // sent after b4's ack
    const v = check(ops, finalFor(ops)).violations;
    expect(v.map((x) => x.invariant)).toEqual(['monotonic']);
    expect(v[0]!.message).toContain('real time');
    expect(v[0]!.ops).toEqual(['b1', 'a5']); // b1: the first acknowledgement of token 2
  });

  test('catches one ledger version acknowledged to two writes', () => {
    const ops = cleanHistory();
    ops.push(op({ op: 'b5', writer: 'w2', kind: 'ledger', token: 2n, version: 3 }));
    expect(invariants(ops, finalFor(ops, { objects: [[LEDGER, { body: '{"op":"b5"}', token: 2n, version: 3 }]] }))).toContain('monotonic');
  });
});

describe('invariant 2: every 200 is in the database, no 409 is', () => {
  test('catches an acknowledged write missing from the database', () => {
    const ops = cleanHistory();
    expect(invariants(ops, finalFor(ops, { objects: [[ops.find((o) => o.op === 'b3')!.key!, null]] }))).toEqual(['durable']);
  });

  test('catches an acknowledged write whose body was replaced', () => {
    const ops = cleanHistory();
    const key = ops.find((o) => o.op === 'a2')!.key!;
    expect(invariants(ops, finalFor(ops, { objects: [[key, { body: 'other', token: 1n, version: 1 }]] }))).toEqual(['durable']);
  });

  test('catches a rejected write found in the database', () => {
    const ops = cleanHistory();
    const key = ops.find((o) => o.op === 'a4')!.key!;
    expect(invariants(ops, finalFor(ops, { objects: [[key, { body: '{"op":"a4"}', token: 1n, version: 1 }]] }))).toEqual(['durable']);
  });

  test('catches a ledger behind its acknowledged version (a lost update)', () => {
    const ops = cleanHistory();
    expect(invariants(ops, finalFor(ops, { objects: [[LEDGER, { body: '{"op":"b2"}', token: 2n, version: 2 }]] }))).toEqual(['durable']);
  });

  test('catches a ledger holding a rejected write (more versions than writes that could have committed)', () => {
    const ops = cleanHistory();
    ops.push(op({ op: 'a5', writer: 'w1', kind: 'ledger', token: 1n, outcome: 'rejected', status: 409, highestToken: 2n }));
    const v = check(ops, finalFor(ops, { objects: [[LEDGER, { body: '{"op":"a5"}', token: 1n, version: 4 }]] })).violations;
    expect(v.map((x) => x.invariant)).toEqual(['durable', 'durable']);
  });
});

describe("invariant 3: writers' terms never overlap", () => {
  test('catches one token accepted from two writers', () => {
    const ops = cleanHistory();
    ops.push(op({ op: 'c1', writer: 'w3', kind: 'object', token: 2n, version: 1 }));
    expect(invariants(ops)).toEqual(['single-term']);
  });

  test('catches a term that commits again after the next term began (interleaved in commit order)', () => {
    const ops = cleanHistory();
    const [b1, b4] = [ops.find((o) => o.op === 'b1')!, ops.find((o) => o.op === 'b4')!];
    ops.push(op({ op: 'a5', writer: 'w1', kind: 'ledger', token: 1n, version: 4, sendT: b1.sendT, ackT: b4.ackT! + 1 }));
    ops.push(op({ op: 'b5', writer: 'w2', kind: 'ledger', token: 2n, version: 5 }));
    const v = check(ops, finalFor(ops)).violations.filter((x) => x.invariant === 'single-term');
    expect(v).toHaveLength(1);
    expect(v[0]!.message).toContain('term of token 1 (w1)');
  });
});

describe('invariant 4: /v1/stats equals the history', () => {
  test('catches a count that differs with no indeterminate operations', () => {
    const ops = cleanHistory();
    const stats = { accepted: 7, rejected: 0, byFenceKey: [{ fenceKey: FK, accepted: 7, rejected: 0 }] };
    const v = check(ops, finalFor(ops, { stats })).violations;
    expect(v.map((x) => x.invariant)).toEqual(['stats', 'stats']); // per fence key and overall
    expect(v[0]!.message).toBe('/v1/stats says 0 rejected, the history 1');
  });

  test('catches a count outside [definite, definite + indeterminate]', () => {
    const ops = cleanHistory();
    ops.push(op({ op: 'b5', writer: 'w2', kind: 'object', token: 2n, outcome: 'indeterminate', status: 503 }));
    const stats = { accepted: 9, rejected: 1, byFenceKey: [{ fenceKey: FK, accepted: 9, rejected: 1 }] };
    expect(check(ops, finalFor(ops, { stats })).violations[0]!.message).toBe('/v1/stats says 9 accepted, the history 7…8');
  });

  test('excuses, and only excuses, the SQL-door counts a SIGKILLed proxy had not added', () => {
    // Invariant: accepted ≥ acknowledged − (SQL-door acknowledgements of the killed proxy within its window).
    const ops = cleanHistory();
    const sql = (n: string, proxy: string) => op({ op: n, writer: 'w2', kind: 'object', token: 2n, door: 'sql', proxy });
    ops.push(sql('b5', 'postgres://proxy-1'), sql('b6', 'postgres://proxy-1'), sql('b7', 'postgres://proxy-2'));
    const killedAt = ops.at(-1)!.ackT! + 1;
    const lost = [{ proxies: ['http://proxy-1', 'postgres://proxy-1'], from: killedAt - 100, to: killedAt }];
    const short = (n: number) => ({ accepted: 10 - n, rejected: 1, byFenceKey: [{ fenceKey: FK, accepted: 10 - n, rejected: 1 }] });
    // Both of proxy 1's SQL acknowledgements may be lost; the HTTP ones and proxy 2's may not.
    expect(check(ops, finalFor(ops, { stats: short(2) }), lost).violations).toEqual([]);
    const three = check(ops, finalFor(ops, { stats: short(3) }), lost).violations;
    expect(three[0]!.message).toBe(
      '/v1/stats says 7 accepted, the history 10 (2 of them acknowledged by a proxy killed before it added its counts)',
    );
    // Without the kill, none may be lost.
    expect(check(ops, finalFor(ops, { stats: short(1) })).violations.map((v) => v.invariant)).toEqual(['stats', 'stats']);
    // Outside the window, none may be lost.
    expect(check(ops, finalFor(ops, { stats: short(1) }), [{ ...lost[0]!, from: killedAt - 1 }]).violations).toHaveLength(2);
  });

  test('catches counts on a fence key the history never wrote', () => {
    const ops = cleanHistory();
    const f = finalFor(ops);
    const stats = {
      ...f.stats,
      accepted: f.stats.accepted + 1,
      byFenceKey: [...f.stats.byFenceKey, { fenceKey: 'chaos/z', accepted: 1, rejected: 0 }],
    };
    expect(check(ops, { ...f, stats }).violations.map((v) => v.fenceKey)).toEqual(['chaos/z', null]);
  });
});

describe('history files', () => {
  test('an invocation without a completion (writer killed in flight) is indeterminate; a torn last line is skipped', () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencepost-chaos-history-'));
    try {
      const inv = (op: string, t: number) =>
        JSON.stringify({
          type: 'invoke',
          op,
          writer: 'w1.0',
          fenceKey: FK,
          kind: 'object',
          key: `${FK}/${op}`,
          token: '3',
          body: 'x',
          proxy: 'p',
          t,
        });
      writeFileSync(
        join(dir, 'w1.0.jsonl'),
        [
          inv('w1.0:1', 10),
          JSON.stringify({ type: 'complete', op: 'w1.0:1', outcome: 'ok', status: 200, version: 1, t: 12 }),
          inv('w1.0:2', 20),
          '{"type":"inv',
        ].join('\n'),
      );
      const ops = readHistory(dir);
      expect(ops.map((o) => [o.op, o.outcome, o.ackT, o.token])).toEqual([
        ['w1.0:1', 'ok', 12, 3n],
        ['w1.0:2', 'indeterminate', null, 3n],
      ]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
