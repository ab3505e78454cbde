// `fencepost elect … --proxy <url> --fence-key <key>`: before each term's command starts, advance the
// fence at the proxy to the new token (locking a zombie predecessor out of every key of that fence),
// and pass FENCEPOST_URL and FENCE_KEY to the command. A 409 means a newer leader exists: resign.
import { electCommand, type BeforeChildStart, type ElectConfig } from './elect.ts';
import { ProxyClient, ProxyError, StaleTokenError } from '../writer/index.ts';

const RETRY_MS = 250;

export async function fencedElectCommand(argv: string[]): Promise<number> {
  return await electCommand(argv, {
    options: { proxy: { type: 'string' }, 'fence-key': { type: 'string' } },
    validate: checkProxyFlags,
    beforeChildStart: advanceFence,
  });
}

/** `--proxy` and `--fence-key` go together: a usage error at start, not a failure every term. */
function checkProxyFlags(config: ElectConfig): string | null {
  const { proxy, 'fence-key': fenceKey } = config.values;
  if (proxy === undefined && fenceKey === undefined) return null;
  if (typeof proxy !== 'string' || typeof fenceKey !== 'string' || proxy === '' || fenceKey === '') return '--proxy <url> and --fence-key <key> go together';
  return null;
}

async function advanceFence(ctx: BeforeChildStart): Promise<Record<string, string> | void> {
  const url = ctx.config.values.proxy;
  const fenceKey = ctx.config.values['fence-key'];
  if (url === undefined && fenceKey === undefined) return;
  if (typeof url !== 'string' || typeof fenceKey !== 'string' || url === '' || fenceKey === '') {
    throw new Error('--proxy and --fence-key go together');
  }
  const client = new ProxyClient(url, { writerId: ctx.config.id, ...(process.env.FENCEPOST_API_KEY ? { apiKey: process.env.FENCEPOST_API_KEY } : {}) });
  // Retry while the proxy is unreachable and the term lasts; a 4xx other than 409 is a setup error.
  while (!ctx.signal.aborted) {
    try {
      const highest = await client.advanceFence(fenceKey, ctx.token);
      ctx.logger.info({ fenceKey, highestToken: highest.toString() }, 'fence advanced');
      return { FENCEPOST_URL: client.baseUrl, FENCE_KEY: fenceKey };
    } catch (err) {
      if (err instanceof StaleTokenError) {
        ctx.logger.warn({ fenceKey, highestToken: err.highestToken.toString() }, 'a newer token holds the fence');
        throw err;
      }
      if (err instanceof ProxyError && err.status < 500) throw err;
      ctx.logger.warn({ err, fenceKey }, 'fence advance failed; retrying');
      await new Promise((r) => setTimeout(r, RETRY_MS));
    }
  }
}
