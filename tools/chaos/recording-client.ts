// A ProxyClient for chaos writers: spreads requests over several proxy instances (round-robin) and
// records every fenced request and its answer in the history, including the fence advances that
// FencedWriter sends on its own.
import { ProxyClient, ProxyError, StaleTokenError, type ProxyClientOptions, type PutResult } from '../../src/writer/index.ts';
import type { HistoryRecorder, OpKind, Outcome } from './history.ts';

export class RecordingProxyClient extends ProxyClient {
  private readonly targets: ProxyClient[];
  private readonly recorder: HistoryRecorder;
  /** Ledger object of each fence key: puts to it are recorded as `ledger` operations. */
  private readonly isLedger: (key: string) => boolean;
  private next = 0;

  constructor(urls: readonly string[], opts: ProxyClientOptions, recorder: HistoryRecorder, isLedger: (key: string) => boolean) {
    if (urls.length === 0) throw new Error('RecordingProxyClient needs at least one proxy URL');
    super(urls[0]!, opts);
    this.targets = urls.map((u) => new ProxyClient(u, opts));
    this.recorder = recorder;
    this.isLedger = isLedger;
  }

  override async put(key: string, body: string | Uint8Array, o: { token: bigint; fenceKey?: string; contentType?: string }): Promise<PutResult> {
    const text = typeof body === 'string' ? body : Buffer.from(body).toString('utf8');
    return await this.recorded(this.isLedger(key) ? 'ledger' : 'object', o.fenceKey ?? key, key, o.token, text, (c) => c.put(key, body, o), (r) => r.version);
  }

  override async advanceFence(fenceKey: string, token: bigint): Promise<bigint> {
    return await this.recorded('fence', fenceKey, null, token, null, (c) => c.advanceFence(fenceKey, token), () => undefined);
  }

  override async delete(): Promise<void> {
    throw new Error('chaos writers do not delete');
  }

  private async recorded<T>(
    kind: OpKind,
    fenceKey: string,
    key: string | null,
    token: bigint,
    body: string | null,
    send: (c: ProxyClient) => Promise<T>,
    versionOf: (r: T) => number | undefined,
  ): Promise<T> {
    const target = this.targets[this.next++ % this.targets.length]!;
    const op = this.recorder.invoke({ fenceKey, kind, key, token: token.toString(), body, proxy: target.baseUrl });
    try {
      const r = await send(target);
      const version = versionOf(r);
      this.recorder.complete(op, { outcome: 'ok', status: 200, ...(version === undefined ? {} : { version }) });
      return r;
    } catch (err) {
      this.recorder.complete(op, classify(err));
      throw err;
    }
  }
}

function classify(err: unknown): { outcome: Outcome; status: number | null; highestToken?: string; error: string } {
  const error = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  if (err instanceof StaleTokenError) return { outcome: 'rejected', status: err.status, highestToken: err.highestToken.toString(), error };
  // 5xx may hide a commit (the database may have committed before the connection broke).
  if (err instanceof ProxyError) return { outcome: err.status >= 500 ? 'indeterminate' : 'failed', status: err.status, error };
  // Refused: the proxy was down and the request never reached it.
  if (err instanceof Error && (err.cause as { code?: string } | undefined)?.code === 'ECONNREFUSED') return { outcome: 'failed', status: null, error };
  // Connection reset, timeout, a body cut short: the request may or may not have committed.
  return { outcome: 'indeterminate', status: null, error };
}
