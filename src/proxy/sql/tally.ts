// Counting fenced transactions as the database saw them: a transaction of a session with a token is
// fenced once its proof (proof.ts, the statement the planner sends before the writer's first)
// completes (CommandComplete "SELECT …"); it committed at a CommandComplete "COMMIT" of the writer's
// (the backend sends it after the commit; a failed block's COMMIT answers "ROLLBACK"), or at a
// ReadyForQuery 'I' that ends an implicit transaction with no error and no ROLLBACK in it. A
// ReadyForQuery 'T' forgets an earlier failure (ROLLBACK TO SAVEPOINT answers "ROLLBACK" too, and
// revives a failed block); 'E' marks one. The ends go to the session's onTransactionEnd (metrics,
// and the accepted counts each proxy adds to Postgres in batches).

/**
 * How a fenced transaction ended, as far as the session sees it: committed (accepted), failed on
 * an error (invalid), rolled back by the writer or left open when it went (rolled_back), or its
 * database connection lost (error; a COMMIT in flight then may or may not have committed).
 */
export type TransactionEnd = 'accepted' | 'invalid' | 'rolled_back' | 'error';

export class TransactionTally {
  /** The fence key of the fenced transaction open now; null: none is. */
  private open: string | null = null;
  /** How the open transaction ends if nothing else happens: it failed, or the writer rolled back. */
  private failure: 'invalid' | 'rolled_back' | null = null;

  constructor(private readonly onEnd: (end: TransactionEnd, fenceKey: string) => void) {}

  /** The fence statement's CommandComplete with `tag`; `fenceKey` null: the session has no token. */
  fenceTag(tag: string, fenceKey: string | null): void {
    if (fenceKey === null || !(tag === 'CALL' || tag.startsWith('SELECT'))) return;
    this.open = fenceKey;
    this.failure = null;
  }

  /** A CommandComplete of the writer's. */
  commandTag(tag: string): void {
    if (tag === 'COMMIT') this.end('accepted');
    else if (tag === 'ROLLBACK' && this.open !== null) this.failure ??= 'rolled_back';
  }

  /** An ErrorResponse. */
  error(): void {
    if (this.open !== null) this.failure = 'invalid';
  }

  /** A ReadyForQuery with the backend's transaction status. */
  ready(status: string): void {
    if (status === 'T') this.failure = null;
    else if (status === 'E') this.failure ??= 'invalid';
    else this.end(this.failure ?? 'accepted');
  }

  /** The open fenced transaction, if any, ended so. */
  end(end: TransactionEnd): void {
    if (this.open === null) return;
    const fenceKey = this.open;
    this.open = null;
    this.failure = null;
    this.onEnd(end, fenceKey);
  }

  /** The open transaction is counted elsewhere (a stale refusal): not here. */
  forget(): void {
    this.open = null;
    this.failure = null;
  }
}
