// The chaos checker: a pure function of the history and the database's final state. Invariants:
//
// 1. monotonic: per fence key, accepted tokens never decrease, (a) in commit order (the ledger's
//    version numbers) and (b) in real time: no accepted write carries a token below a token whose
//    write was acknowledged before it was sent.
// 2. durable: every write answered 200 is in the database at the end with its body, and no write
//    answered 409 is. Indeterminate writes (5xx, timeout, cut connection, writer killed) may be
//    either. For the ledger, which each write overwrites: its final version counts every committed
//    ledger write, so it lies between the acknowledged count and that plus the indeterminate ones,
//    and its final body is an acknowledged or indeterminate write's (the one with that version).
// 3. single term: a token belongs to one writer, and in commit order a token's writes are one
//    contiguous run: once another token's write commits, the earlier term never commits again.
// 4. stats: /v1/stats equals the history: per fence key and overall, accepted lies in
//    [200s, 200s + indeterminate], rejected in [409s, 409s + indeterminate] (exact without
//    indeterminate operations), and together they do not exceed the operations sent. HTTP object
//    writes are counted in their own transaction. The SQL doors (/v1/transactions, the SQL
//    endpoint) are counted by each proxy and added in batches (src/fence/accepted-counts.ts), so a
//    proxy killed with SIGKILL loses what it had not added yet: accepted may fall short by that
//    proxy's SQL-door acknowledgements in the COUNT_LOSS_WINDOW_MS before it died, never more.
import type { Operation } from './history.ts';

export const INVARIANTS = ['monotonic', 'durable', 'single-term', 'stats'] as const;
export type Invariant = (typeof INVARIANTS)[number];

export const INVARIANT_TITLES: Record<Invariant, string> = {
  monotonic: '1 accepted tokens never decrease',
  durable: '2 every 200 in the DB, no 409',
  'single-term': "3 writers' terms never overlap",
  stats: '4 /v1/stats equals the history',
};

export interface Violation {
  invariant: Invariant;
  fenceKey: string | null;
  message: string;
  /** Operation ids involved. */
  ops: string[];
}

export interface StoredObject {
  body: string;
  token: bigint;
  version: number;
}

export interface StatsSnapshot {
  accepted: number;
  rejected: number;
  byFenceKey: readonly { fenceKey: string; accepted: number; rejected: number }[];
}

export interface FinalState {
  /** Every object of the run present in the database at the end, by key. */
  objects: ReadonlyMap<string, StoredObject>;
  stats: StatsSnapshot;
}

/** A proxy died without adding its batched counts: SQL-door writes it acknowledged in (from, to] may be uncounted. */
export interface CountLoss {
  /** The proxy's URLs as operations name them (HTTP and SQL endpoint). */
  proxies: readonly string[];
  from: number;
  to: number;
}

/**
 * How far back a SIGKILLed proxy's counts may be unflushed: one flush interval, one flush timeout
 * (a flush that fails keeps its counts for the next), and a margin for a loaded machine.
 */
export const COUNT_LOSS_WINDOW_MS = 2000 + 5000 + 3000;

export interface CheckResult {
  ok: boolean;
  violations: Violation[];
}

const byFence = (ops: readonly Operation[]): Map<string, Operation[]> => {
  const m = new Map<string, Operation[]>();
  for (const o of ops) m.set(o.fenceKey, [...(m.get(o.fenceKey) ?? []), o]);
  return m;
};

export function check(ops: readonly Operation[], final: FinalState, countLoss: readonly CountLoss[] = []): CheckResult {
  const violations: Violation[] = [];
  const groups = byFence(ops);
  for (const [fenceKey, fops] of [...groups].sort(([a], [b]) => a.localeCompare(b))) {
    const v = (invariant: Invariant, message: string, involved: Operation[]) =>
      violations.push({ invariant, fenceKey, message, ops: involved.map((o) => o.op) });
    const ok = fops.filter((o) => o.outcome === 'ok');
    const ledgerOk = ok.filter((o) => o.kind === 'ledger' && o.version !== null).sort((a, b) => a.version! - b.version!);

    // 1a. Commit order (ledger versions): tokens never decrease; each version acknowledged once.
    for (let i = 1; i < ledgerOk.length; i++) {
      const prev = ledgerOk[i - 1]!;
      const cur = ledgerOk[i]!;
      if (cur.version === prev.version)
        v('monotonic', `ledger version ${cur.version} acknowledged twice (${prev.op}, ${cur.op})`, [prev, cur]);
      else if (cur.token < prev.token)
        v('monotonic', `commit order: ledger v${cur.version} has token ${cur.token} after v${prev.version} with token ${prev.token}`, [
          prev,
          cur,
        ]);
    }
    // 1b. Real time: no accepted write below a token acknowledged before it was sent.
    const byAck = ok.filter((o) => o.ackT !== null).sort((a, b) => a.ackT! - b.ackT!);
    let i = 0;
    let maxAcked: Operation | null = null;
    for (const o of [...ok].sort((a, b) => a.sendT - b.sendT)) {
      while (i < byAck.length && byAck[i]!.ackT! < o.sendT) {
        if (maxAcked === null || byAck[i]!.token > maxAcked.token) maxAcked = byAck[i]!;
        i++;
      }
      if (maxAcked && o.token < maxAcked.token) {
        v(
          'monotonic',
          `real time: ${o.op} (token ${o.token}) accepted, sent ${o.sendT - maxAcked.ackT!} ms after ${maxAcked.op} (token ${maxAcked.token}) was acknowledged`,
          [maxAcked, o],
        );
      }
    }

    // 2. Durable: written-once keys.
    for (const o of fops.filter((x) => x.kind === 'object' && x.key !== null)) {
      const stored = final.objects.get(o.key!);
      if (o.outcome === 'ok') {
        if (!stored) v('durable', `${o.op} was acknowledged (200) but ${o.key} is not in the database`, [o]);
        else if (stored.body !== o.body) v('durable', `${o.op} was acknowledged (200) but ${o.key} holds another body`, [o]);
        else if (stored.token !== o.token)
          v('durable', `${o.op} was acknowledged with token ${o.token} but ${o.key} carries token ${stored.token}`, [o]);
      } else if ((o.outcome === 'rejected' || o.outcome === 'failed') && stored) {
        v(
          'durable',
          `${o.op} was ${o.outcome === 'rejected' ? 'rejected (409)' : `refused (${o.status ?? 'no connection'})`} but ${o.key} is in the database`,
          [o],
        );
      }
    }
    // 2. Durable: the ledger.
    const ledgerOps = fops.filter((o) => o.kind === 'ledger');
    if (ledgerOps.length > 0) {
      const key = ledgerOps[0]!.key!;
      const stored = final.objects.get(key);
      const finalVersion = stored?.version ?? 0;
      const indet = ledgerOps.filter((o) => o.outcome === 'indeterminate');
      const maxAckedVersion = ledgerOk.at(-1)?.version ?? 0;
      if (maxAckedVersion > finalVersion)
        v('durable', `ledger ${key}: version ${maxAckedVersion} was acknowledged but the database holds version ${finalVersion}`, [
          ledgerOk.at(-1)!,
        ]);
      if (finalVersion < ledgerOk.length)
        v('durable', `ledger ${key}: ${ledgerOk.length} writes acknowledged but only ${finalVersion} committed`, []);
      if (finalVersion > ledgerOk.length + indet.length) {
        v(
          'durable',
          `ledger ${key}: ${finalVersion} writes committed but only ${ledgerOk.length} acknowledged + ${indet.length} indeterminate: a refused write committed`,
          [],
        );
      }
      if (stored) {
        const owner = ledgerOps.find((o) => o.body === stored.body);
        const atFinal = ledgerOk.find((o) => o.version === finalVersion);
        if (!owner) v('durable', `ledger ${key} holds a body no write of this run sent`, []);
        else if (owner.outcome === 'rejected' || owner.outcome === 'failed')
          v(
            'durable',
            `ledger ${key} holds the body of ${owner.op}, which was ${owner.outcome === 'rejected' ? 'rejected (409)' : 'refused'}`,
            [owner],
          );
        else if (atFinal && atFinal !== owner)
          v('durable', `ledger ${key} v${finalVersion} was acknowledged to ${atFinal.op} but holds the body of ${owner.op}`, [
            atFinal,
            owner,
          ]);
      }
    }

    // 3. Single term: one writer per token; each token's commits contiguous in commit order.
    const writersOf = new Map<bigint, Set<string>>();
    for (const o of ok) writersOf.set(o.token, (writersOf.get(o.token) ?? new Set()).add(o.writer));
    for (const [token, ws] of writersOf) {
      if (ws.size > 1)
        v(
          'single-term',
          `token ${token} was accepted from ${ws.size} writers: ${[...ws].sort().join(', ')}`,
          ok.filter((o) => o.token === token),
        );
    }
    // A term resumed by the highest token so far was interrupted by a lower one: that one is reported.
    const ended = new Map<bigint, Operation>();
    let highest = ledgerOk[0]?.token ?? 0n;
    for (let k = 1; k < ledgerOk.length; k++) {
      const prev = ledgerOk[k - 1]!;
      const cur = ledgerOk[k]!;
      if (cur.token !== prev.token && !ended.has(prev.token)) ended.set(prev.token, cur);
      const endedBy = ended.get(cur.token);
      const interrupted = cur.token >= highest;
      if (cur.token > highest) highest = cur.token;
      if (cur.token !== prev.token && endedBy && !interrupted) {
        v(
          'single-term',
          `term of token ${cur.token} (${cur.writer}) committed ledger v${cur.version} after token ${endedBy.token} (${endedBy.writer}) had committed v${endedBy.version}`,
          [endedBy, cur],
        );
      }
    }
  }

  // 4. Stats, per fence key and overall.
  const uncountable = (o: Operation) =>
    (o.door === 'tx' || o.door === 'sql') &&
    o.ackT !== null &&
    countLoss.some((l) => l.proxies.includes(o.proxy) && o.ackT! > l.from && o.ackT! <= l.to);
  const count = (fops: readonly Operation[]) => ({
    ok: fops.filter((o) => o.outcome === 'ok').length,
    /** Acknowledged writes whose count a killed proxy may have lost. */
    lost: fops.filter((o) => o.outcome === 'ok' && uncountable(o)).length,
    rejected: fops.filter((o) => o.outcome === 'rejected').length,
    indeterminate: fops.filter((o) => o.outcome === 'indeterminate').length,
  });
  const stat = (fenceKey: string | null, c: ReturnType<typeof count>, s: { accepted: number; rejected: number } | undefined) => {
    const v = (message: string) => violations.push({ invariant: 'stats', fenceKey, message, ops: [] });
    const accepted = s?.accepted ?? 0;
    const rejected = s?.rejected ?? 0;
    const range = (lo: number, n: number) => (n === 0 ? `${lo}` : `${lo}…${lo + n}`);
    const badAccepted = accepted < c.ok - c.lost || accepted > c.ok + c.indeterminate;
    const badRejected = rejected < c.rejected || rejected > c.rejected + c.indeterminate;
    const lost = c.lost === 0 ? '' : ` (${c.lost} of them acknowledged by a proxy killed before it added its counts)`;
    if (badAccepted) v(`/v1/stats says ${accepted} accepted, the history ${range(c.ok, c.indeterminate)}${lost}`);
    if (badRejected) v(`/v1/stats says ${rejected} rejected, the history ${range(c.rejected, c.indeterminate)}`);
    if (!badAccepted && !badRejected && accepted + rejected > c.ok + c.rejected + c.indeterminate)
      v(
        `/v1/stats counts ${accepted + rejected} answered writes, more than the ${c.ok + c.rejected + c.indeterminate} the history could explain`,
      );
  };
  const statsByKey = new Map(final.stats.byFenceKey.map((f) => [f.fenceKey, f]));
  for (const [fenceKey, fops] of [...groups].sort(([a], [b]) => a.localeCompare(b))) stat(fenceKey, count(fops), statsByKey.get(fenceKey));
  for (const f of final.stats.byFenceKey) if (!groups.has(f.fenceKey)) stat(f.fenceKey, count([]), f);
  stat(null, count(ops), final.stats);

  return { ok: violations.length === 0, violations };
}
