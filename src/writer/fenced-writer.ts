// The writer side, joining an Election to the fencing proxy: every write carries the current
// term's token and the writer's fence key. On being elected it first advances the fence, so a
// zombie ex-leader is locked out of every key behind that fence at once; a 409 makes it step down.
import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import type { Election } from '../election/index.ts';
import { ProxyClient, StaleTokenError, type ProxyError, type PutResult } from './proxy-client.ts';
import { advanceFence } from './advance.ts';

/** A write was attempted while this writer is not a leader with an advanced fence; no request was sent. */
export class NotLeaderError extends Error {
  constructor(message = 'not the leader (or the fence is not advanced yet): write refused without a request') {
    super(message);
    this.name = 'NotLeaderError';
  }
}

export interface FencedWriterOptions {
  election: Election;
  proxy: ProxyClient | string;
  fenceKey: string;
  logger?: Logger;
  /** Delay between retries of the fence advance when the proxy is unreachable. Default 250 ms. */
  retryDelayMs?: number;
}

export interface FencedWriterEvents {
  /** Leader and fence advanced: writes may go out with `token`. */
  ready: [{ token: bigint }];
  /** A 409 showed a newer token; this writer resigned. */
  'stepped-down': [{ token: bigint; highestToken: bigint }];
  /** The proxy refused the fence advance with a 4xx other than 409 (401, 403…); this writer resigned. */
  refused: [{ token: bigint; error: ProxyError }];
}

export class FencedWriter extends EventEmitter<FencedWriterEvents> {
  readonly election: Election;
  readonly proxy: ProxyClient;
  readonly fenceKey: string;
  private readonly log: Logger | undefined;
  private readonly retryDelayMs: number;
  /** Token whose fence advance succeeded; null while not ready. */
  private readyToken: bigint | null = null;
  private readonly onElected = ({ token }: { token: bigint }) => void this.advance(token);
  private readonly onRevoked = () => {
    this.readyToken = null;
  };

  constructor(opts: FencedWriterOptions) {
    super();
    this.election = opts.election;
    this.proxy = typeof opts.proxy === 'string' ? new ProxyClient(opts.proxy, { writerId: opts.election.id }) : opts.proxy;
    this.fenceKey = opts.fenceKey;
    this.log = opts.logger?.child({ fenceKey: opts.fenceKey });
    this.retryDelayMs = opts.retryDelayMs ?? 250;
    this.election.on('elected', this.onElected);
    this.election.on('revoked', this.onRevoked);
    const current = this.election.token;
    if (this.election.isLeader && current !== null) void this.advance(current);
  }

  /** The token writes carry now, or null when writes would be refused. */
  get token(): bigint | null {
    return this.readyToken !== null && this.election.isLeader && this.election.token === this.readyToken ? this.readyToken : null;
  }

  get isReady(): boolean {
    return this.token !== null;
  }

  /** Resolves with the token once leader with the fence advanced; rejects if the proxy refuses the advance. */
  waitUntilReady(signal?: AbortSignal): Promise<bigint> {
    const t = this.token;
    if (t !== null) return Promise.resolve(t);
    return new Promise((resolve, reject) => {
      const cleanup = () => {
        this.off('ready', onReady);
        this.off('refused', onRefused);
        signal?.removeEventListener('abort', onAbort);
      };
      const onReady = ({ token }: { token: bigint }) => (cleanup(), resolve(token));
      const onRefused = ({ error }: { error: ProxyError }) => (cleanup(), reject(error));
      const onAbort = () => (cleanup(), reject(signal?.reason ?? new Error('aborted')));
      this.on('ready', onReady);
      this.on('refused', onRefused);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  async put(key: string, body: string | Uint8Array, opts: { contentType?: string } = {}): Promise<PutResult> {
    const token = this.requireToken();
    return await this.fenced(token, () => this.proxy.put(key, body, { token, fenceKey: this.fenceKey, ...opts }));
  }

  async delete(key: string): Promise<void> {
    const token = this.requireToken();
    await this.fenced(token, () => this.proxy.delete(key, { token, fenceKey: this.fenceKey }));
  }

  /** Stops following the election (does not close it). */
  close(): void {
    this.election.off('elected', this.onElected);
    this.election.off('revoked', this.onRevoked);
    this.readyToken = null;
  }

  private requireToken(): bigint {
    const t = this.token;
    if (t === null) throw new NotLeaderError();
    return t;
  }

  /** Runs a request carrying `token`; on 409 steps down and rethrows the StaleTokenError. */
  private async fenced<T>(token: bigint, send: () => Promise<T>): Promise<T> {
    try {
      return await send();
    } catch (err) {
      if (err instanceof StaleTokenError) await this.stepDown(token, err.highestToken);
      throw err;
    }
  }

  private async stepDown(token: bigint, highestToken: bigint): Promise<void> {
    this.log?.warn({ token: token.toString(), highestToken: highestToken.toString() }, 'stale token: stepping down');
    if (this.readyToken === token) this.readyToken = null;
    if (this.election.token === token) await this.election.resign();
    this.emit('stepped-down', { token, highestToken });
  }

  /** The new leader's first act: raise the fence to its token (see advance.ts). */
  private async advance(token: bigint): Promise<void> {
    const outcome = await advanceFence(this.proxy, this.fenceKey, token, {
      signal: this.election.signal, // the term's: aborts when leadership ends
      retryDelayMs: this.retryDelayMs,
      onRetry: (err) => this.log?.warn({ err, token: token.toString() }, 'fence advance failed; retrying'),
    });
    switch (outcome.kind) {
      case 'advanced':
        if (this.election.token !== token) return;
        this.readyToken = token;
        this.log?.info({ token: token.toString() }, 'fence advanced: ready to write');
        this.emit('ready', { token });
        return;
      case 'stale':
        await this.stepDown(token, outcome.error.highestToken);
        return;
      case 'refused':
        // A setup error (bad key, forbidden fence): leading without being able to write would
        // block every other replica, so hand over, and tell the application.
        this.log?.error({ err: outcome.error, token: token.toString() }, 'the proxy refused the fence advance: resigning');
        if (this.election.token === token) await this.election.resign();
        this.emit('refused', { token, error: outcome.error });
        return;
      case 'aborted':
        return;
    }
  }
}
