// The chaos run's summary table: operations by outcome, faults by kind, violations by invariant.
import { INVARIANTS, INVARIANT_TITLES, type CheckResult } from './checker.ts';
import { DOORS, type Operation, type OpKind, type Outcome } from './history.ts';
import { FAULT_KINDS, type FaultEvent } from './nemesis.ts';
import type { Verdict } from './verdict.ts';

const OUTCOMES: readonly Outcome[] = ['ok', 'rejected', 'failed', 'indeterminate'];
const KINDS: readonly OpKind[] = ['object', 'ledger', 'fence'];

export interface ReportInput {
  seed: number;
  loadMs: number;
  fenceMode: string;
  writers: number;
  proxies: number;
  ops: readonly Operation[];
  faults: readonly FaultEvent[];
  check: CheckResult;
  /** The last line (verdict.ts): PASS only with no violation and every started fault applied. */
  verdict: Verdict;
  dir: string;
  /** Violations listed in full, per invariant. Default 5. */
  listPerInvariant?: number;
}

const row = (cells: (string | number)[], widths: number[]) =>
  cells.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]!) : String(c).padStart(widths[i]!))).join('  ');

export function formatReport(r: ReportInput): string {
  const out: string[] = [];
  out.push(
    `chaos run: seed ${r.seed}, ${(r.loadMs / 1000).toFixed(1)} s of load, fence mode ${r.fenceMode}, ${r.writers} writers, ${r.proxies} proxies, 3 ZooKeeper servers`,
  );
  out.push('');
  const ow = [22, 8, 8, 6, 13, 6];
  out.push(row(['operations', 'ok(200)', 'rej(409)', 'failed', 'indeterminate', 'total'], ow));
  for (const k of [...KINDS, 'all' as const]) {
    const ops = k === 'all' ? r.ops : r.ops.filter((o) => o.kind === k);
    const label = k === 'all' ? 'all' : k === 'fence' ? 'fence advance' : k === 'ledger' ? 'ledger put' : 'object put';
    out.push(row([label, ...OUTCOMES.map((o) => ops.filter((x) => x.outcome === o).length), ops.length], ow));
  }
  // Object and ledger writes by door, when more than one door was used.
  const writes = r.ops.filter((o) => o.kind !== 'fence');
  if (new Set(writes.map((o) => o.door)).size > 1) {
    for (const d of DOORS) {
      const ops = writes.filter((o) => o.door === d);
      if (ops.length === 0) continue;
      const label = d === 'http' ? '  puts via PUT' : d === 'tx' ? '  puts via /v1/tx' : '  puts via SQL';
      out.push(row([label, ...OUTCOMES.map((o) => ops.filter((x) => x.outcome === o).length), ops.length], ow));
    }
  }
  out.push('');
  const fw = [22, 8, 6];
  out.push(row(['faults', 'injected', 'errors'], fw));
  for (const k of FAULT_KINDS) {
    const f = r.faults.filter((x) => x.kind === k);
    out.push(row([k, f.length, f.filter((x) => x.error).length], fw));
  }
  out.push('');
  const vw = [36, 10];
  out.push(row(['invariant', 'violations'], vw));
  for (const inv of INVARIANTS) out.push(row([INVARIANT_TITLES[inv], r.check.violations.filter((v) => v.invariant === inv).length], vw));
  const n = r.listPerInvariant ?? 5;
  if (!r.check.ok) {
    out.push('');
    for (const inv of INVARIANTS) {
      const vs = r.check.violations.filter((v) => v.invariant === inv);
      for (const v of vs.slice(0, n)) out.push(`  [${inv}] ${v.fenceKey ?? 'overall'}: ${v.message}`);
      if (vs.length > n) out.push(`  [${inv}] … and ${vs.length - n} more`);
    }
  }
  for (const f of r.faults.filter((x) => x.error)) out.push(`  fault #${f.n} ${f.kind} failed: ${f.error}`);
  out.push('');
  out.push(`history, schedule and logs: ${r.dir}`);
  out.push(r.verdict.line);
  return out.join('\n');
}
