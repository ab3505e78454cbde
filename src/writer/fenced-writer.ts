// The writer side, joining an Election to the fencing proxy: every write carries the current
// term's token and the writer's fence key. On being elected it first advances the fence, so a
// zombie ex-leader is locked out of every key behind that fence at once; a 409 makes it step down.
import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import type { Election } from '../election/index.ts';
import { ProxyClient, ProxyError, StaleTokenError, type PutResult } from './proxy-client.ts';

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

  /** Resolves with the token once leader with the fence advanced. */
  waitUntilReady(signal?: AbortSignal): Promise<bigint> {
    const t = this.token;
    if (t !== null) return Promise.resolve(t);
    return new Promise((resolve, reject) => {
      const onReady = ({ token }: { token: bigint }) => {
        signal?.removeEventListener('abort', onAbort);
        resolve(token);
      };
      const onAbort = () => {
        this.off('ready', onReady);
        reject(signal?.reason ?? new Error('aborted'));
      };
      this.once('ready', onReady);
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

  /** The new leader's first act: raise the fence to its token, retrying while the proxy is unreachable. */
  private async advance(token: bigint): Promise<void> {
    while (this.election.isLeader && this.election.token === token) {
      try {
        await this.proxy.advanceFence(this.fenceKey, token);
        if (this.election.token !== token) return;
        this.readyToken = token;
        this.log?.info({ token: token.toString() }, 'fence advanced: ready to write');
        this.emit('ready', { token });
        return;
      } catch (err) {
        if (err instanceof StaleTokenError) {
          await this.stepDown(token, err.highestToken);
          return;
        }
        const retryable = !(err instanceof ProxyError) || err.status >= 500;
        this.log?.warn({ err, token: token.toString(), retryable }, 'fence advance failed');
        if (!retryable) return;
        await new Promise((r) => setTimeout(r, this.retryDelayMs));
      }
    }
  }
}
