// How a batch of fenced operations reaches the database: which statement (fencedPuts, fencedWrite)
// carries it. Each statement goes through the coalescer's runner, which retries only it.
import type pg from 'pg';
import { LRUCache } from 'lru-cache';
import * as q from './sql/objects.ts';
import type { Query } from './sql/query.ts';
import type { WriteRow } from './sql/objects.ts';

/** Fence keys whose last passing token the write strategy remembers (see fencedStrategy). */
const PASSED_HINTS = 10_000;

/** One row per operation of a batch: `highest_token` null when rejected, `version` and `etag` set for puts. */
export interface WriteOutcome {
  ord: number;
  highest_token: string | null;
  version: string | null;
  etag?: string | null;
  object_refused?: boolean | null;
  precondition_failed?: boolean | null;
}

/** Runs one statement on the store's pool, again after a deadlock or serialization failure. */
export type RunStatement = <R extends pg.QueryResultRow>(statement: Query) => Promise<R[]>;

/**
 * How a batch reaches the database. The product has one (fencedStrategy below). Each statement
 * goes through `run`, so a retry repeats only the statement that failed, never one that committed.
 */
/**
 * A strategy's later statement failed after an earlier one committed: `applied` are the outcomes
 * that committed (they are answered as such), `cause` the failure of every other operation.
 */
export class PartialWriteError extends Error {
  constructor(
    readonly applied: WriteOutcome[],
    override readonly cause: unknown,
  ) {
    super('part of a batch committed; the rest failed');
  }
}

export type WriteStrategy = (run: RunStatement, rows: readonly WriteRow[]) => Promise<WriteOutcome[]>;

/**
 * The product's strategy. A batch of plain puts whose fences this store last saw pass at those very
 * tokens (the leader's steady writes) goes through the cheaper fencedPuts; whatever it left
 * untouched (the fence was raised meanwhile, an object of another fence) then goes through
 * fencedWrite, which decides each operation. Any other batch goes through fencedWrite alone: a
 * batch with a new fence, a raise or a stale token would pay for both statements. The hint is only
 * a guess at which statement applies; both are correct for any batch. Two statements for one batch
 * answer concurrent requests, so answering some before the others is a valid order.
 */
export function fencedStrategy(): WriteStrategy {
  /** Fence key → the token (decimal) its last write through this store passed with. */
  const passed = new LRUCache<string, string>({ max: PASSED_HINTS });
  const note = (rows: readonly WriteRow[], outcomes: readonly WriteOutcome[]) => {
    for (const o of outcomes) {
      const r = rows[o.ord];
      if (!r) continue;
      if (o.highest_token !== null && o.object_refused !== true) passed.set(r.fenceKey, o.highest_token);
      else if (o.highest_token === null && passed.get(r.fenceKey) === r.token.toString()) passed.delete(r.fenceKey);
    }
  };
  return async (run, rows) => {
    if (!rows.every((r) => q.isPlainPut(r) && passed.get(r.fenceKey) === r.token.toString())) {
      const decided = await run<WriteOutcome>(q.fencedWrite(rows));
      note(rows, decided);
      return decided;
    }
    const applied = await run<WriteOutcome>(q.fencedPuts(rows));
    if (applied.length === rows.length) return applied;
    const done = new Set(applied.map((r) => r.ord));
    const rest = rows.map((r, ord) => ({ r, ord })).filter(({ ord }) => !done.has(ord));
    let decided: WriteOutcome[];
    try {
      decided = await run<WriteOutcome>(q.fencedWrite(rest.map(({ r }) => r)));
    } catch (err) {
      if (applied.length === 0) throw err;
      throw new PartialWriteError(applied, err);
    }
    const outcomes = decided.map((o) => ({ ...o, ord: rest[o.ord]!.ord }));
    note(rows, outcomes);
    return [...applied, ...outcomes];
  };
}
