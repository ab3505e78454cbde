// `fencepost elect … --proxy <url> --fence-key <key>`: before each term's command starts, advance the
// fence at the proxy to the new token (locking a zombie predecessor out of every key of that fence),
// and pass FENCEPOST_URL and FENCE_KEY to the command. A 409 means a newer leader exists: resign.
// Another 4xx (bad key, forbidden fence) is a setup error: exit 1.
import { electCommand, FatalHookError, type BeforeChildStart, type ElectConfig } from './elect.ts';
import { ProxyClient } from '../writer/index.ts';
import { advanceFence } from '../writer/advance.ts';

export async function fencedElectCommand(argv: string[]): Promise<number> {
  return await electCommand(argv, {
    options: { proxy: { type: 'string' }, 'fence-key': { type: 'string' } },
    validate: checkProxyFlags,
    beforeChildStart: advanceBeforeChild,
  });
}

/** `--proxy` and `--fence-key` go together: a usage error at start, not a failure every term. */
function checkProxyFlags(config: ElectConfig): string | null {
  const { proxy, 'fence-key': fenceKey } = config.values;
  if (proxy === undefined && fenceKey === undefined) return null;
  if (typeof proxy !== 'string' || typeof fenceKey !== 'string' || proxy === '' || fenceKey === '') return '--proxy <url> and --fence-key <key> go together';
  return null;
}

async function advanceBeforeChild(ctx: BeforeChildStart): Promise<Record<string, string> | void> {
  const { proxy: url, 'fence-key': fenceKey } = ctx.config.values;
  if (typeof url !== 'string' || typeof fenceKey !== 'string') return; // checked at start: both or neither
  const client = new ProxyClient(url, { writerId: ctx.config.id, ...(process.env.FENCEPOST_API_KEY ? { apiKey: process.env.FENCEPOST_API_KEY } : {}) });
  const outcome = await advanceFence(client, fenceKey, ctx.token, {
    signal: ctx.signal,
    onRetry: (err) => ctx.logger.warn({ err, fenceKey }, 'fence advance failed; retrying'),
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
      throw new FatalHookError(`the proxy refused the fence advance: ${outcome.error.message}`, { cause: outcome.error });
    case 'aborted':
      return;
  }
}
