// Two leaders of one fence key writing through the proxy, as an HA run needs them: the old one
// (token 1) writes without pause from the start; the new one (token 2) raises the fence when told
// (PUT /v1/fences, retried until 200), then writes. Each write is a new object key, so a read-back
// finds every write that committed. Every request and its answer is recorded.

export interface WriteRecord {
  leader: 1 | 2;
  kind: 'write' | 'raise';
  /** Object key (writes) or fence key (the raise). */
  key: string;
  sentAt: number;
  answeredAt: number;
  /** HTTP status; null when no answer came (connection refused or reset, client timeout). */
  status: number | null;
  /** The error body's `error` code, when there is one. */
  code: string | null;
}

export interface LoadOptions {
  proxyUrl: string;
  fenceKey: string;
  /** Prefix of every object key of the run, e.g. `ha/crash/`. */
  prefix: string;
  /** Requests in flight at once per leader. */
  concurrency: number;
  /** A request without an answer by then counts as no answer. */
  requestTimeoutMs: number;
}

export class TwoLeaders {
  readonly records: WriteRecord[] = [];
  /** When the new leader's raise answered 200 (epoch ms), once it has. */
  raiseAcknowledgedAt: number | null = null;
  private stopped = false;
  private readonly loops: Promise<void>[] = [];
  private seq = 0;
  private readonly opts: LoadOptions;

  constructor(opts: LoadOptions) {
    this.opts = opts;
  }

  /** The old leader starts writing. */
  startOldLeader(): void {
    for (let i = 0; i < this.opts.concurrency; i++) this.loops.push(this.writeLoop(1));
  }

  /** The new leader raises the fence to 2 (retried until 200 or stop), then writes. */
  async raise(): Promise<void> {
    while (!this.stopped) {
      const r = await this.send(2, 'raise', this.opts.fenceKey, 'PUT', `/v1/fences/${encodeURIComponent(this.opts.fenceKey)}`);
      if (r.status === 200) {
        this.raiseAcknowledgedAt = r.answeredAt;
        for (let i = 0; i < this.opts.concurrency; i++) this.loops.push(this.writeLoop(2));
        return;
      }
      await pause(200);
    }
  }

  /** Successful writes (200) of a leader answered after `since`. */
  acceptedSince(leader: 1 | 2, since: number): number {
    return this.records.filter((r) => r.leader === leader && r.kind === 'write' && r.status === 200 && r.sentAt >= since).length;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all(this.loops);
  }

  private async writeLoop(leader: 1 | 2): Promise<void> {
    while (!this.stopped) {
      const key = `${this.opts.prefix}t${leader}/${++this.seq}`;
      const r = await this.send(leader, 'write', key, 'PUT', `/v1/objects/${key}`, JSON.stringify({ leader, key }));
      // After a refusal or an outage, do not spin: a real writer backs off a little.
      if (r.status !== 200) await pause(r.status === 409 ? 50 : 100);
    }
  }

  private async send(
    leader: 1 | 2,
    kind: WriteRecord['kind'],
    key: string,
    method: string,
    path: string,
    body?: string,
  ): Promise<WriteRecord> {
    const sentAt = Date.now();
    let status: number | null = null;
    let code: string | null = null;
    try {
      const res = await fetch(`${this.opts.proxyUrl}${path}`, {
        method,
        headers: {
          'Fencing-Token': String(leader),
          'Fence-Key': this.opts.fenceKey,
          'Content-Type': 'application/json',
          'Writer-Id': `leader-${leader}`,
        },
        ...(body === undefined ? {} : { body }),
        signal: AbortSignal.timeout(this.opts.requestTimeoutMs),
      });
      status = res.status;
      const text = await res.text();
      if (status !== 200) code = errorCode(text);
    } catch {
      status = null;
    }
    const record: WriteRecord = { leader, kind, key, sentAt, answeredAt: Date.now(), status, code };
    this.records.push(record);
    return record;
  }
}

function errorCode(text: string): string | null {
  try {
    const e = (JSON.parse(text) as { error?: unknown }).error;
    return typeof e === 'string' ? e : null;
  } catch {
    return null;
  }
}

function pause(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
