// `fencepost elect … --proxy <url> --fence-key <key>` (elect.ts): before each term's command starts, advance the
// fence at the proxy to the new token (locking a zombie predecessor out of every key of that fence),
// and pass FENCEPOST_URL and FENCE_KEY to the command. A 409 means a newer leader exists: resign.
// Another 4xx (bad key, forbidden fence) is a setup error: exit 1.
// A proxy that does not answer (or answers 5xx) is retried ADVANCE_ATTEMPTS times, ADVANCE_RETRY_MS
// apart; then elect leaves the election, so a standby (which may reach the proxy) is elected at once,
// and exits 1 with one line naming --proxy. Not resign-and-rejoin: with a wrong --proxy on every
// replica that would pass leadership round forever with the command never running; an exit is what
// a supervisor (systemd, Kubernetes) shows and restarts with its own backoff.
import type { Logger } from 'pino';
import { ProxyClient } from '../writer/index.ts';
import { advanceFence } from '../writer/advance.ts';
import { CommandFailure, firstLine } from './command-failure.ts';
import type { ElectionMetrics } from './election-metrics.ts';

/** --proxy and --fence-key. */
export interface ProxyFence {
  proxy: string;
  fenceKey: string;
}

/** The term a fence is advanced for. */
export interface Term {
  token: bigint;
  /** The candidate id: the advance's Writer-Id. */
  id: string;
  logger: Logger;
  /** Counts failed advances. */
  metrics: ElectionMetrics;
  /** Aborts when the term ends or `fencepost elect` is told to stop (SIGTERM/SIGINT). */
  signal: AbortSignal;
}

/** Failed fence advances in a row (proxy unreachable or 5xx) after which elect gives up leading. */
export const ADVANCE_ATTEMPTS = 5;
/** Pause between them: 5 attempts span at least 4 s, enough for a proxy restart to finish. */
const ADVANCE_RETRY_MS = 1000;
/** Longest wait for one answer (a raise may first wait FENCEPOST_RAISE_WAIT_MS for older transactions). */
const ADVANCE_TIMEOUT_MS = 10_000;

/**
 * Advances `fence` to the term's token: the environment the command gets (FENCEPOST_URL,
 * FENCE_KEY), or nothing when the term ended meanwhile. A StaleTokenError resigns the term; a
 * CommandFailure ends elect.
 */
export async function advanceAtProxy(fence: ProxyFence, ctx: Term): Promise<Record<string, string> | void> {
  const { proxy: url, fenceKey } = fence;
  const client = new ProxyClient(url, {
    writerId: ctx.id,
    timeoutMs: ADVANCE_TIMEOUT_MS,
    ...(process.env.FENCEPOST_API_KEY ? { apiKey: process.env.FENCEPOST_API_KEY } : {}),
  });
  const giveUp = new AbortController();
  let failures = 0;
  let lastError: unknown;
  const outcome = await advanceFence(client, fenceKey, ctx.token, {
    signal: AbortSignal.any([ctx.signal, giveUp.signal]),
    retryDelayMs: ADVANCE_RETRY_MS,
    onRetry: (err) => {
      failures++;
      lastError = err;
      ctx.metrics.fenceAdvanceFailed();
      if (failures >= ADVANCE_ATTEMPTS) return giveUp.abort();
      ctx.logger.warn(
        { reason: describeFailure(err), fenceKey, attempt: failures, of: ADVANCE_ATTEMPTS },
        'fence advance failed; retrying',
      );
    },
  });
  switch (outcome.kind) {
    case 'advanced':
      ctx.logger.info({ fenceKey, highestToken: outcome.highestToken.toString() }, 'fence advanced');
      return { FENCEPOST_URL: client.baseUrl, FENCE_KEY: fenceKey };
    case 'stale':
      ctx.logger.warn({ fenceKey, highestToken: outcome.error.highestToken.toString() }, 'a newer token holds the fence');
      throw outcome.error; // resigns this term
    case 'refused':
      // 401/403/400 will not go away by retrying: stop instead of resigning forever.
      throw new CommandFailure(
        'elect',

        `--proxy ${client.baseUrl} refused the fence advance of ${JSON.stringify(fenceKey)}: ${outcome.error.message}`,
        { cause: outcome.error },
      );
    case 'aborted':
      if (!giveUp.signal.aborted || ctx.signal.aborted) return; // the term ended or elect was stopped
      throw new CommandFailure(
        'elect',

        `--proxy ${client.baseUrl}: the fence advance of ${JSON.stringify(fenceKey)} failed ${failures} times in a row (${describeFailure(lastError)}): left the election so a standby can lead`,
        { cause: lastError },
      );
  }
}

/** fetch's "fetch failed" hides the reason in its cause (ECONNREFUSED, a timeout…). */
function describeFailure(err: unknown): string {
  const cause = (err as { cause?: unknown } | null)?.cause;
  const code = (cause as { code?: unknown } | null)?.code;
  if (typeof code === 'string') return `${firstLine(cause)}`.includes(code) ? firstLine(cause) : `${code}: ${firstLine(cause)}`;
  if (err instanceof Error && err.name === 'TimeoutError') return `no answer within ${ADVANCE_TIMEOUT_MS / 1000} s`;
  return cause instanceof Error ? `${firstLine(err)}: ${firstLine(cause)}` : firstLine(err);
}
