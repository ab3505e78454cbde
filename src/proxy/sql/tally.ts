// Counting a fenced connection's transactions as the database reported them, from its answers
// alone: a transaction starts with the first statement answered after the session was idle (a
// CommandComplete or ErrorResponse, or a ReadyForQuery in a block); it committed at a
// CommandComplete "COMMIT" (a failed block's COMMIT answers "ROLLBACK"), or at a ReadyForQuery
// 'I' that ends an implicit transaction with no error and no ROLLBACK in it. A ReadyForQuery 'T'
// forgets an earlier failure (ROLLBACK TO SAVEPOINT answers "ROLLBACK" too, and revives a failed
// block); 'E' marks one. The ends go to the session's onTransactionEnd (metrics, and the accepted
// counts each proxy adds to Postgres in batches).

/**
 * How a fenced transaction ended, as far as the session sees it: committed (accepted), failed on
 * an error (invalid), rolled back by the writer or left open when it went (rolled_back), or its
 * database connection lost (error; a COMMIT in flight then may or may not have committed).
 */
export type TransactionEnd = 'accepted' | 'invalid' | 'rolled_back' | 'error';

export class TransactionTally {
  /** A transaction is open now. */
  private open = false;
  /** How the open transaction ends if nothing else happens: it failed, or the writer rolled back. */
  private failure: 'invalid' | 'rolled_back' | null = null;

  constructor(private readonly onEnd: (end: TransactionEnd) => void) {}

  /** A CommandComplete with `tag` (only COMMIT and ROLLBACK are read; null: another). */
  command(tag: string | null): void {
    this.open = true;
    if (tag === 'COMMIT') this.end('accepted');
    else if (tag === 'ROLLBACK') this.failure ??= 'rolled_back';
  }

  /** An ErrorResponse. */
  error(): void {
    this.open = true;
    this.failure = 'invalid';
  }

  /** A ReadyForQuery with the backend's transaction status. */
  ready(status: number): void {
    if (status === 0x54 /* T */) {
      this.open = true;
      this.failure = null;
    } else if (status === 0x45 /* E */) {
      this.open = true;
      this.failure ??= 'invalid';
    } else this.end(this.failure ?? 'accepted');
  }

  /** The open transaction, if any, ended so. */
  end(end: TransactionEnd): void {
    const open = this.open;
    this.open = false;
    this.failure = null;
    if (open) this.onEnd(end);
  }
}
