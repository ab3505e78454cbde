// A new leader's first act, shared by FencedWriter and `fencepost elect --proxy`: raise the fence
// to the term's token, retrying while the proxy is unreachable or answers 5xx, until done or the
// signal (term over, or stop) aborts.
import { setTimeout as delay } from 'node:timers/promises';
import { ProxyError, StaleTokenError, type ProxyClient } from './proxy-client.ts';

export type AdvanceOutcome =
  | { kind: 'advanced'; highestToken: bigint }
  /** 409: a newer token holds the fence; this leader must step down. */
  | { kind: 'stale'; error: StaleTokenError }
  /** Another 4xx (401, 403, 400…): a setup error that retrying will not fix. */
  | { kind: 'refused'; error: ProxyError }
  | { kind: 'aborted' };

export async function advanceFence(
  client: ProxyClient,
  fenceKey: string,
  token: bigint,
  opts: { signal: AbortSignal; retryDelayMs?: number; onRetry?: (err: unknown) => void },
): Promise<AdvanceOutcome> {
  while (!opts.signal.aborted) {
    try {
      return { kind: 'advanced', highestToken: await client.advanceFence(fenceKey, token) };
    } catch (err) {
      if (err instanceof StaleTokenError) return { kind: 'stale', error: err };
      if (err instanceof ProxyError && err.status < 500) return { kind: 'refused', error: err };
      opts.onRetry?.(err);
      await sleep(opts.retryDelayMs ?? 250, opts.signal);
    }
  }
  return { kind: 'aborted' };
}

/** Waits `ms`, or less when `signal` aborts (the caller checks it). */
async function sleep(ms: number, signal: AbortSignal): Promise<void> {
  await delay(ms, undefined, { signal }).catch(() => {});
}
