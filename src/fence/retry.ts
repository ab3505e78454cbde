// The one retry loop for statements and transactions that lost a race: a serialization failure or
// deadlock rolled the whole statement (or transaction) back, so running it again is safe.
import { setTimeout as sleep } from 'node:timers/promises';
import { isRetryable } from './pg-errors.ts';

/** Back-off step for a single statement (a write batch, recording rejections) that lost a race. */
export const STATEMENT_BACKOFF_MS = 5;

export interface RetryOptions {
  /** Extra attempts after the first. */
  retries: number;
  /** Back-off before attempt n+1: a random wait up to backoffMs × (n + 1). 0 = none. */
  backoffMs: number;
  /** Which errors are a lost race (default: SQLSTATE 40001 / 40P01). */
  retryable?: (err: unknown) => boolean;
  /** Stop retrying (e.g. a deadline passed): the last error is thrown. */
  stop?: () => boolean;
}

export async function retryOnConflict<T>(fn: () => Promise<T>, opts: RetryOptions): Promise<T> {
  const retryable = opts.retryable ?? isRetryable;
  for (let attempt = 0; ; attempt++) {
    try {
      return await fn();
    } catch (err) {
      if (!retryable(err) || attempt >= opts.retries || opts.stop?.() === true) throw err;
      if (opts.backoffMs > 0) await sleep(Math.random() * opts.backoffMs * (attempt + 1));
    }
  }
}
