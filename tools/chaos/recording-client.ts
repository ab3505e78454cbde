// A ProxyClient for chaos writers: spreads requests over several proxy instances (round-robin) and
// records every fenced request and its answer in the history, including the fence advances that
// FencedWriter sends on its own. A writer's object writes go through one door: `http` (PUT
// /v1/objects), `tx` (POST /v1/transactions with the upsert a PUT runs) or `sql` (the same upsert
// through the proxies' SQL endpoints with node-postgres); fence advances are always HTTP.
import { ProxyClient, ProxyError, StaleTokenError, type ProxyClientOptions, type PutResult } from '../../src/writer/index.ts';
import { SqlDoor, SqlDoorError, UPSERT_OBJECT } from '../../src/demo/sql-door.ts';
import type { Door, HistoryRecorder, OpKind, Outcome } from './history.ts';

export interface DoorOptions {
  door: Door;
  /** The proxies' SQL endpoints (postgres://host:port/db), for `sql`. */
  pgwireUrls?: readonly string[];
}

/** A write through POST /v1/transactions: one fence, the upsert a fenced PUT runs. */
async function transactionPut(
  baseUrl: string,
  writerId: string | undefined,
  timeoutMs: number,
  key: string,
  body: string,
  token: bigint,
  fenceKey: string,
): Promise<PutResult> {
  const res = await fetch(`${baseUrl}/v1/transactions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(writerId ? { 'writer-id': writerId } : {}) },
    body: JSON.stringify({
      fences: [{ key: fenceKey, token: token.toString() }],
      statements: [{ sql: UPSERT_OBJECT, params: [key, fenceKey, token.toString(), body] }],
    }),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const json = (await res.json().catch(() => ({}))) as Record<string, unknown>;
  if (res.status === 409 && json.error === 'stale_token') throw new StaleTokenError(409, json);
  if (!res.ok) throw new ProxyError(res.status, json);
  const results = json.results as { rows: { version: number | string }[] }[];
  return { key, fenceKey, token, version: Number(results[0]!.rows[0]!.version) };
}

export class RecordingProxyClient extends ProxyClient {
  private readonly targets: ProxyClient[];
  private readonly recorder: HistoryRecorder;
  /** Ledger object of each fence key: puts to it are recorded as `ledger` operations. */
  private readonly isLedger: (key: string) => boolean;
  private readonly door: Door;
  private readonly sqlDoors: SqlDoor[];
  private readonly writerId: string | undefined;
  private readonly timeoutMs: number;
  private next = 0;

  constructor(
    urls: readonly string[],
    opts: ProxyClientOptions,
    recorder: HistoryRecorder,
    isLedger: (key: string) => boolean,
    door: DoorOptions = { door: 'http' },
  ) {
    if (urls.length === 0) throw new Error('RecordingProxyClient needs at least one proxy URL');
    super(urls[0]!, opts);
    this.targets = urls.map((u) => new ProxyClient(u, opts));
    this.recorder = recorder;
    this.isLedger = isLedger;
    this.door = door.door;
    this.writerId = opts.writerId;
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.sqlDoors = (door.pgwireUrls ?? []).map(
      (url) => new SqlDoor({ url, writerId: opts.writerId ?? 'chaos', timeoutMs: this.timeoutMs }),
    );
    if (this.door === 'sql' && this.sqlDoors.length === 0) throw new Error("a SQL writer needs the proxies' SQL endpoints");
  }

  override async put(
    key: string,
    body: string | Uint8Array,
    o: { token: bigint; fenceKey?: string; contentType?: string },
  ): Promise<PutResult> {
    const text = typeof body === 'string' ? body : Buffer.from(body).toString('utf8');
    const kind = this.isLedger(key) ? 'ledger' : 'object';
    const fenceKey = o.fenceKey ?? key;
    if (this.door === 'sql') {
      const door = this.sqlDoors[this.next++ % this.sqlDoors.length]!;
      return await this.record(
        kind,
        fenceKey,
        key,
        o.token,
        text,
        door.url,
        'sql',
        () => door.put(key, text, { token: o.token, fenceKey }),
        (r) => r.version,
      );
    }
    if (this.door === 'tx') {
      const target = this.targets[this.next++ % this.targets.length]!;
      return await this.record(
        kind,
        fenceKey,
        key,
        o.token,
        text,
        target.baseUrl,
        'tx',
        () => transactionPut(target.baseUrl, this.writerId, this.timeoutMs, key, text, o.token, fenceKey),
        (r) => r.version,
      );
    }
    return await this.recorded(
      kind,
      fenceKey,
      key,
      o.token,
      text,
      (c) => c.put(key, body, o),
      (r) => r.version,
    );
  }

  override async advanceFence(fenceKey: string, token: bigint): Promise<bigint> {
    return await this.recorded(
      'fence',
      fenceKey,
      null,
      token,
      null,
      (c) => c.advanceFence(fenceKey, token),
      () => undefined,
    );
  }

  async close(): Promise<void> {
    await Promise.all(this.sqlDoors.map((d) => d.close()));
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
    return await this.record(kind, fenceKey, key, token, body, target.baseUrl, 'http', () => send(target), versionOf);
  }

  private async record<T>(
    kind: OpKind,
    fenceKey: string,
    key: string | null,
    token: bigint,
    body: string | null,
    proxy: string,
    door: Door,
    send: () => Promise<T>,
    versionOf: (r: T) => number | undefined,
  ): Promise<T> {
    const op = this.recorder.invoke({ fenceKey, kind, key, token: token.toString(), body, proxy, door });
    try {
      const r = await send();
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
  // SQL: an error answer on a live session rolled the write back; a lost session or a shutdown may hide a commit.
  if (err instanceof SqlDoorError) return { outcome: err.indeterminate ? 'indeterminate' : 'failed', status: null, error };
  // 5xx may hide a commit (the database may have committed before the connection broke).
  if (err instanceof ProxyError) return { outcome: err.status >= 500 ? 'indeterminate' : 'failed', status: err.status, error };
  // Refused: the proxy was down and the request never reached it.
  if (err instanceof Error && (err.cause as { code?: string } | undefined)?.code === 'ECONNREFUSED')
    return { outcome: 'failed', status: null, error };
  // Connection reset, timeout, a body cut short: the request may or may not have committed.
  return { outcome: 'indeterminate', status: null, error };
}
