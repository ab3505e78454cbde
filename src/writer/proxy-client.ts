// A small typed client for the fencing proxy's HTTP API (v1). Tokens are bigint; errors carry the
// registry code.

export interface ProxyClientOptions {
  /** Sent as `Writer-Id`, kept in the proxy's rejection log. */
  writerId?: string;
  /** Sent as `Authorization: Bearer …` when the proxy requires keys. */
  apiKey?: string;
  /** Per-request deadline. Default 10 000 ms. */
  timeoutMs?: number;
}

export interface PutResult {
  key: string;
  fenceKey: string;
  token: bigint;
  version: number;
}

export interface StoredObject {
  body: Buffer;
  contentType: string;
  token: bigint;
  etag: string;
}

export interface FenceInfo {
  fenceKey: string;
  highestToken: bigint;
  updatedAt: string;
  accepted: number;
  rejected: number;
  /** The writer id of the request that last raised the fence (null when none was sent). */
  raisedBy: string | null;
}

/** An error answer from the proxy, with its registry code. */
export class ProxyError extends Error {
  readonly code: string;
  readonly status: number;
  readonly body: Record<string, unknown>;
  constructor(status: number, body: Record<string, unknown>) {
    super(`${status} ${String(body.error ?? 'error')}: ${String(body.message ?? '')}`);
    this.name = 'ProxyError';
    this.status = status;
    this.code = typeof body.error === 'string' ? body.error : 'unknown';
    this.body = body;
  }
}

/** 409 stale_token: a newer token has been accepted for this fence key. */
export class StaleTokenError extends ProxyError {
  readonly fenceKey: string;
  readonly token: bigint;
  readonly highestToken: bigint;
  constructor(status: number, body: Record<string, unknown>) {
    super(status, body);
    this.name = 'StaleTokenError';
    this.fenceKey = String(body.fenceKey);
    this.token = BigInt(String(body.token));
    this.highestToken = BigInt(String(body.highestToken));
  }
}

export class ProxyClient {
  readonly baseUrl: string;
  private readonly opts: ProxyClientOptions;

  constructor(baseUrl: string, opts: ProxyClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.opts = opts;
  }

  async put(key: string, body: string | Uint8Array, o: { token: bigint; fenceKey?: string; contentType?: string }): Promise<PutResult> {
    const res = await this.request(
      'PUT',
      `/v1/objects/${encodeURIComponent(key)}`,
      {
        'fencing-token': o.token.toString(),
        'content-type': o.contentType ?? 'application/octet-stream',
        ...(o.fenceKey === undefined ? {} : { 'fence-key': o.fenceKey }),
      },
      body,
    );
    const json = (await res.json()) as { key: string; fenceKey: string; token: string; version: number };
    return { key: json.key, fenceKey: json.fenceKey, token: BigInt(json.token), version: json.version };
  }

  async delete(key: string, o: { token: bigint; fenceKey?: string }): Promise<void> {
    await this.request('DELETE', `/v1/objects/${encodeURIComponent(key)}`, {
      'fencing-token': o.token.toString(),
      ...(o.fenceKey === undefined ? {} : { 'fence-key': o.fenceKey }),
    });
  }

  /** PUT /v1/fences/:fenceKey — returns the fence's highest token after the advance. */
  async advanceFence(fenceKey: string, token: bigint): Promise<bigint> {
    const res = await this.request('PUT', `/v1/fences/${encodeURIComponent(fenceKey)}`, { 'fencing-token': token.toString() });
    return BigInt(((await res.json()) as { highestToken: string }).highestToken);
  }

  async get(key: string): Promise<StoredObject | null> {
    const res = await this.request('GET', `/v1/objects/${encodeURIComponent(key)}`, {}, undefined, [404]);
    if (res.status === 404) return null;
    return {
      body: Buffer.from(await res.arrayBuffer()),
      contentType: res.headers.get('content-type') ?? 'application/octet-stream',
      token: BigInt(res.headers.get('fencing-token') ?? '0'),
      etag: res.headers.get('etag') ?? '',
    };
  }

  async fence(fenceKey: string): Promise<FenceInfo | null> {
    const res = await this.request('GET', `/v1/fences/${encodeURIComponent(fenceKey)}`, {}, undefined, [404]);
    if (res.status === 404) return null;
    const j = (await res.json()) as Omit<FenceInfo, 'highestToken'> & { highestToken: string };
    return { ...j, highestToken: BigInt(j.highestToken) };
  }

  private async request(
    method: string,
    path: string,
    headers: Record<string, string>,
    body?: string | Uint8Array,
    allow: number[] = [],
  ): Promise<Response> {
    const res = await fetch(this.baseUrl + path, {
      method,
      headers: {
        ...headers,
        ...(this.opts.writerId ? { 'writer-id': this.opts.writerId } : {}),
        ...(this.opts.apiKey ? { authorization: `Bearer ${this.opts.apiKey}` } : {}),
      },
      ...(body === undefined ? {} : { body }),
      signal: AbortSignal.timeout(this.opts.timeoutMs ?? 10_000),
    });
    if (res.ok || allow.includes(res.status)) return res;
    const json = (await res.json().catch(() => ({ error: 'unknown', message: res.statusText }))) as Record<string, unknown>;
    throw res.status === 409 && json.error === 'stale_token' ? new StaleTokenError(res.status, json) : new ProxyError(res.status, json);
  }
}
