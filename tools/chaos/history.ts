// The history of a chaos run: every request a writer sends, and its answer. Writers append an
// `invoke` record before sending and a `complete` record after the answer (appendFileSync, one
// file per writer process), so a writer killed mid-request leaves an invocation without a
// completion, which the checker treats as indeterminate. `readHistory` pairs them into operations.
import { appendFileSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** `object`: a PUT of a key written once; `ledger`: a PUT overwriting the fence key's ledger; `fence`: a fence advance. */
export type OpKind = 'object' | 'ledger' | 'fence';
/**
 * `ok` = 200 (committed), `rejected` = 409 stale_token (not committed), `failed` = another 4xx (not
 * committed), `indeterminate` = 5xx, timeout, connection error, or the writer died in flight.
 */
export type Outcome = 'ok' | 'rejected' | 'failed' | 'indeterminate';
/**
 * How a write reached the database: `http` PUT /v1/objects (and every fence advance), `tx` POST
 * /v1/transactions, `sql` the SQL endpoint (node-postgres; a stale token is SQLSTATE FP409, recorded
 * as `rejected`). All three write the same rows of fencepost.objects and count in /v1/stats.
 */
export type Door = 'http' | 'tx' | 'sql';
export const DOORS: readonly Door[] = ['http', 'tx', 'sql'];

export interface InvokeRecord {
  type: 'invoke';
  op: string;
  /** Writer process: `<slot>.<incarnation>`, e.g. `w2.1`. */
  writer: string;
  fenceKey: string;
  kind: OpKind;
  /** Object key; null for a fence advance. */
  key: string | null;
  token: string;
  body: string | null;
  /** Proxy instance the request went to (its SQL endpoint's URL for `sql`). */
  proxy: string;
  /** Absent: `http` (histories written before the SQL endpoint). */
  door?: Door;
  t: number;
}

export interface CompleteRecord {
  type: 'complete';
  op: string;
  outcome: Outcome;
  status: number | null;
  version?: number;
  highestToken?: string;
  error?: string;
  t: number;
}

export type HistoryRecord = InvokeRecord | CompleteRecord;

/** One request and its answer. Times are wall-clock ms from the writer's process (one machine, one clock). */
export interface Operation {
  op: string;
  writer: string;
  fenceKey: string;
  kind: OpKind;
  key: string | null;
  token: bigint;
  body: string | null;
  proxy: string;
  door: Door;
  /** Taken before the request left. */
  sendT: number;
  /** Taken after the answer arrived; null when none did. */
  ackT: number | null;
  outcome: Outcome;
  status: number | null;
  /** Object version the proxy reported for an `ok` PUT. */
  version: number | null;
  highestToken: bigint | null;
  error: string | null;
}

/** Appends one writer process's records to its own file. */
export class HistoryRecorder {
  private readonly file: string;
  private readonly writer: string;
  private seq = 0;

  constructor(file: string, writer: string) {
    this.file = file;
    this.writer = writer;
  }

  invoke(r: Omit<InvokeRecord, 'type' | 'op' | 'writer' | 't'>): string {
    const op = `${this.writer}:${++this.seq}`;
    this.append({ type: 'invoke', op, writer: this.writer, t: Date.now(), ...r });
    return op;
  }

  complete(op: string, r: Omit<CompleteRecord, 'type' | 'op' | 't'>): void {
    this.append({ type: 'complete', op, t: Date.now(), ...r });
  }

  private append(r: HistoryRecord): void {
    appendFileSync(this.file, JSON.stringify(r) + '\n');
  }
}

/** Pairs the records of every `*.jsonl` file in `dir` into operations, in send order. */
export function readHistory(dir: string): Operation[] {
  const records: HistoryRecord[] = [];
  for (const f of readdirSync(dir)
    .filter((n) => n.endsWith('.jsonl'))
    .sort()) {
    for (const line of readFileSync(join(dir, f), 'utf8').split('\n')) {
      if (!line.trim()) continue;
      try {
        records.push(JSON.parse(line) as HistoryRecord);
      } catch {
        // A writer SIGKILLed mid-append leaves a torn last line: that invocation never left the process.
      }
    }
  }
  return pairRecords(records);
}

export function pairRecords(records: readonly HistoryRecord[]): Operation[] {
  const done = new Map<string, CompleteRecord>();
  for (const r of records) if (r.type === 'complete') done.set(r.op, r);
  const ops: Operation[] = [];
  for (const r of records) {
    if (r.type !== 'invoke') continue;
    const c = done.get(r.op);
    ops.push({
      op: r.op,
      writer: r.writer,
      fenceKey: r.fenceKey,
      kind: r.kind,
      key: r.key,
      token: BigInt(r.token),
      body: r.body,
      proxy: r.proxy,
      door: r.door ?? 'http',
      sendT: r.t,
      ackT: c ? c.t : null,
      outcome: c ? c.outcome : 'indeterminate',
      status: c ? c.status : null,
      version: c?.version ?? null,
      highestToken: c?.highestToken === undefined ? null : BigInt(c.highestToken),
      error: c ? (c.error ?? null) : 'no answer recorded: the writer died in flight',
    });
  }
  return ops.sort((a, b) => a.sendT - b.sendT || a.op.localeCompare(b.op));
}

/** Writes the paired history as one JSON-lines file (tokens as decimal strings). */
export function writeOperations(file: string, ops: readonly Operation[]): void {
  writeFileSync(
    file,
    ops.map((o) => JSON.stringify({ ...o, token: o.token.toString(), highestToken: o.highestToken?.toString() ?? null })).join('\n') + '\n',
  );
}
