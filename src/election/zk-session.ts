// One ZooKeeper session over node-zookeeper-client, hardened against the client's known gaps:
// - no read timeout: a half-open connection looks healthy. A liveness probe sends a cheap request
//   every T/6 and drops the connection when nothing was heard for 2/3 of the negotiated timeout T.
// - requests queued while disconnected never call back after expiry: every request has a deadline,
//   and all pending requests are rejected the moment the session is lost or closed.
// - the server reports expiry only on reconnect: while disconnected, the session is declared lost by
//   our own clock at (send time of the last request the server answered) + T, which is no later than
//   the earliest moment the server can expire it.
// - watchers do not fire on disconnect: state changes are events here ('suspended', 'reconnected', 'lost').
// A ZkSession never outlives its session: after 'lost' the owner opens a new one.
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import zookeeper from 'node-zookeeper-client';
import type { Logger } from 'pino';
import { pino } from 'pino';
import { SessionLostError, ZK_CODES, ZkError, ZkTimeoutError } from './errors.ts';
import type { AclEntry, DigestAuth } from './acl.ts';

/** ConnectionManager.STATES inside node-zookeeper-client 1.1.3. */
const CM_STATE = { DISCONNECTED: 0, CONNECTING: 1, CONNECTED: 2, CLOSING: -1, CLOSED: -2 } as const;

/** How long the CLI (elect, leader, doctor) waits for a ZooKeeper session before it says it cannot reach --zk. */
export const ZK_CONNECT_WAIT_MS = 5000;
export type SessionState = 'connecting' | 'connected' | 'suspended' | 'lost' | 'closed';
/** Why a session ended: the server said so on reconnect, our own clock ran out, or auth failed. */
export type SessionLostReason = 'expired' | 'deadline' | 'auth-failed';

export interface ZkSessionOptions {
  /** Connect string, e.g. `127.0.0.1:2181,127.0.0.1:2182/chroot`. */
  connect: string;
  /** Requested session timeout; the server clamps it to [2, 20] × tickTime by default. */
  sessionTimeoutMs: number;
  /** How long `open()` waits for the first connection. Default: max(sessionTimeoutMs, 5000). */
  connectTimeoutMs?: number;
  /** Deadline of each request. Default: the negotiated session timeout. */
  requestTimeoutMs?: number;
  logger?: Logger;
  /** Aborts a pending `open()`. */
  signal?: AbortSignal;
  /** Digest credentials, sent on every (re)connect before any request (see acl.ts). */
  auth?: DigestAuth;
}

export interface ZkSessionEvents {
  connected: [];
  suspended: [];
  reconnected: [];
  lost: [reason: SessionLostReason];
  closed: [];
}

const now = (): number => performance.now();

export class ZkSession extends EventEmitter<ZkSessionEvents> {
  private readonly client: zookeeper.Client;
  private readonly log: Logger;
  private readonly opts: ZkSessionOptions;
  private stateValue: SessionState = 'connecting';
  private readonly pending = new Map<number, (err: Error) => void>();
  private requestSeq = 0;
  private tickTimer: NodeJS.Timeout | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private readonly openedAt = now();
  private lastReplyAt = now();
  /** Send time of the newest request the server answered: the server heard from us no earlier. */
  private lastAckSentAt = now();
  private lastProbeAt = 0;
  private lastTickAt = 0;
  private tickMs = 0;
  private suspendedAt = 0;
  private attemptStartedAt = now();
  private idHex = '';

  private constructor(opts: ZkSessionOptions) {
    super();
    this.opts = opts;
    this.log = opts.logger ?? pino({ level: 'silent' });
    this.client = zookeeper.createClient(opts.connect, { sessionTimeout: opts.sessionTimeoutMs, spinDelay: 100, retries: 0 });
    // Before connect(): the client then sends it right after each connect request, ahead of anything queued.
    if (opts.auth) this.client.addAuthInfo('digest', Buffer.from(`${opts.auth.user}:${opts.auth.password}`));
    this.client.on('connected', () => this.onConnected());
    this.client.on('disconnected', () => this.onDisconnected());
    this.client.on('expired', () => this.declareLost('expired'));
    this.client.on('authenticationFailed', () => this.declareLost('auth-failed'));
    this.client.connectionManager.on('state', (st: number) => {
      if (st === CM_STATE.CONNECTING) this.attemptStartedAt = now();
    });
  }

  /** Opens a new session; rejects if no server accepts it within `connectTimeoutMs`. */
  static async open(opts: ZkSessionOptions): Promise<ZkSession> {
    const s = new ZkSession(opts);
    const timeoutMs = opts.connectTimeoutMs ?? Math.max(opts.sessionTimeoutMs, ZK_CONNECT_WAIT_MS);
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        cleanup();
        s.terminate();
        s.stateValue = 'closed';
        reject(new Error(`could not connect to ZooKeeper at ${opts.connect} within ${timeoutMs} ms`));
      }, timeoutMs);
      const onConnected = (): void => {
        cleanup();
        resolve();
      };
      const onLost = (reason: SessionLostReason): void => {
        cleanup();
        reject(new Error(`ZooKeeper session could not be established: ${reason}`));
      };
      const onAbort = (): void => {
        cleanup();
        s.terminate();
        s.stateValue = 'closed';
        reject(new Error('opening the ZooKeeper session was aborted', { cause: opts.signal?.reason }));
      };
      const cleanup = (): void => {
        opts.signal?.removeEventListener('abort', onAbort);
        clearTimeout(timer);
        s.off('connected', onConnected);
        s.off('lost', onLost);
      };
      if (opts.signal?.aborted) return onAbort();
      opts.signal?.addEventListener('abort', onAbort);
      s.on('connected', onConnected);
      s.on('lost', onLost);
      s.client.connect();
    });
    return s;
  }

  get state(): SessionState {
    return this.stateValue;
  }
  /** Session id as 16 hex digits (as ZooKeeper logs print it). */
  get sessionId(): string {
    return this.idHex;
  }
  /** The session timeout the server granted. */
  get negotiatedTimeoutMs(): number {
    return this.client.getSessionTimeout();
  }
  get requestTimeoutMs(): number {
    return this.opts.requestTimeoutMs ?? this.negotiatedTimeoutMs;
  }
  /** Connection is declared dead after this long without hearing from the server. */
  get livenessTimeoutMs(): number {
    return Math.floor((this.negotiatedTimeoutMs * 2) / 3);
  }
  /** `host:port` of the server this session is connected to, or null while disconnected. */
  get serverAddress(): string | null {
    const sock = this.client.connectionManager.socket;
    if (this.stateValue !== 'connected' || !sock || sock.remotePort === undefined) return null;
    return `${sock.remoteAddress}:${sock.remotePort}`;
  }
  /** Session id and password, e.g. to end this session from another connection in a test. */
  credentials(): { id: Buffer; password: Buffer } {
    return { id: this.client.getSessionId(), password: this.client.getSessionPassword() };
  }
  /** True if `stat` describes an ephemeral node owned by this session. */
  owns(stat: zookeeper.Stat): boolean {
    return stat.ephemeralOwner.equals(this.client.getSessionId());
  }

  /** Creates `path`; with `acl`, the node gets that ACL (default: world:anyone, all permissions). */
  create(path: string, data: Buffer | null, mode: number, acl?: readonly AclEntry[]): Promise<string> {
    return this.request<string>('create', path, (cb) =>
      acl ? this.client.create(path, data, toClientAcl(acl), mode, cb) : this.client.create(path, data, mode, cb),
    );
  }
  /** Deletes `path`; resolves false if it did not exist. */
  async remove(path: string, version = -1): Promise<boolean> {
    try {
      await this.request<void>('remove', path, (cb) => this.client.remove(path, version, (e) => cb(e, undefined)));
      return true;
    } catch (err) {
      if (err instanceof ZkError && err.code === ZK_CODES.NO_NODE) return false;
      throw err;
    }
  }
  exists(path: string, watcher?: zookeeper.Watcher): Promise<zookeeper.Stat | null> {
    return this.request<zookeeper.Stat | null>('exists', path, (cb) =>
      watcher ? this.client.exists(path, watcher, cb) : this.client.exists(path, cb),
    );
  }
  getChildren(path: string): Promise<{ children: string[]; stat: zookeeper.Stat }> {
    return this.request('getChildren', path, (cb) => this.client.getChildren(path, (e, children, stat) => cb(e, { children, stat })));
  }
  getData(path: string): Promise<{ data: Buffer | undefined; stat: zookeeper.Stat }> {
    return this.request('getData', path, (cb) => this.client.getData(path, (e, data, stat) => cb(e, { data, stat })));
  }
  /** The node's ACL and stat (`stat.aversion` counts changes of the ACL). Needs no permission. */
  getAcl(path: string): Promise<{ acl: AclEntry[]; stat: zookeeper.Stat }> {
    return this.request('getACL', path, (cb) =>
      this.client.getACL(path, (e, acls, stat) =>
        cb(e, { acl: (acls ?? []).map((a) => ({ perms: a.permission, scheme: a.id.scheme, id: a.id.id })), stat }),
      ),
    );
  }
  /**
   * Creates `path` and its missing parents as PERSISTENT nodes (never containers: see election.ts),
   * with `acl` if given. Nodes that exist keep their ACL.
   */
  async mkdirp(path: string, acl?: readonly AclEntry[]): Promise<void> {
    await this.request<string>('mkdirp', path, (cb) =>
      acl
        ? this.client.mkdirp(path, null, toClientAcl(acl), zookeeper.CreateMode.PERSISTENT, cb)
        : this.client.mkdirp(path, null, zookeeper.CreateMode.PERSISTENT, cb),
    );
  }
  /** One round trip to the server; resolves with the round-trip time in ms. */
  async ping(): Promise<number> {
    const t0 = now();
    await this.exists('/');
    return now() - t0;
  }

  /** Closes the session (its ephemeral nodes vanish at once). Falls back to dropping the socket. */
  async close(): Promise<void> {
    if (this.stateValue === 'lost' || this.stateValue === 'closed') {
      this.stateValue = 'closed';
      return;
    }
    const wasConnected = this.stateValue === 'connected';
    this.stateValue = 'closed';
    this.stopTimers();
    this.rejectPending('closed');
    if (wasConnected) {
      const cm = this.client.connectionManager;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, Math.min(this.requestTimeoutMs, 2000));
        function done(): void {
          clearTimeout(timer);
          cm.off('state', onState);
          resolve();
        }
        const onState = (st: number): void => {
          if (st === CM_STATE.CLOSED) done();
        };
        cm.on('state', onState);
        this.client.close();
      });
    }
    this.terminate();
    this.log.debug({ zkSession: this.idHex }, 'session closed');
    this.emit('closed');
  }

  /**
   * Stops all traffic without closing the session, as if this process had been SIGKILLed: the
   * server keeps the session (and its ephemeral nodes) until it expires.
   */
  abandon(): void {
    if (this.stateValue === 'lost' || this.stateValue === 'closed') return;
    this.stateValue = 'closed';
    this.stopTimers();
    this.rejectPending('abandoned');
    this.terminate();
  }

  /** Closes the current TCP connection; the client reconnects (same session) to the next server. */
  dropConnection(why: string): void {
    this.log.warn({ zkSession: this.idHex, why }, 'dropping ZooKeeper connection');
    this.client.connectionManager.socket?.destroy();
  }

  private request<T>(op: string, path: string, invoke: (cb: (err: zookeeper.Exception | null, value: T) => void) => void): Promise<T> {
    if (this.stateValue === 'lost' || this.stateValue === 'closed') {
      return Promise.reject(new SessionLostError(op, path, this.stateValue));
    }
    const timeoutMs = this.requestTimeoutMs;
    return new Promise<T>((resolve, reject) => {
      const id = ++this.requestSeq;
      const sentAt = now();
      const timer = setTimeout(() => {
        if (this.pending.delete(id)) reject(new ZkTimeoutError(op, path, timeoutMs));
      }, timeoutMs);
      this.pending.set(id, (err) => {
        clearTimeout(timer);
        reject(err);
      });
      invoke((err, value) => {
        if (!this.pending.delete(id)) return; // already timed out or the session ended
        clearTimeout(timer);
        const code = err ? err.getCode() : 0;
        // CONNECTION_LOSS and SESSION_EXPIRED are produced locally by the client; anything else is a server reply.
        if (code !== ZK_CODES.CONNECTION_LOSS && code !== ZK_CODES.SESSION_EXPIRED) this.noteReply(sentAt);
        if (err) reject(new ZkError(op, path, code, err.getName(), { cause: err }));
        else resolve(value);
      });
    });
  }

  private noteReply(sentAt: number): void {
    this.lastReplyAt = now();
    if (sentAt > this.lastAckSentAt) this.lastAckSentAt = sentAt;
  }

  private onConnected(): void {
    if (this.stateValue !== 'connecting' && this.stateValue !== 'suspended') return;
    const first = this.stateValue === 'connecting';
    // The server has just accepted the session: it heard our connect request, sent after this moment.
    this.lastAckSentAt = Math.max(this.lastAckSentAt, first ? this.openedAt : this.suspendedAt);
    this.lastReplyAt = now();
    this.stateValue = 'connected';
    clearTimeout(this.deadlineTimer);
    this.deadlineTimer = undefined;
    this.idHex = this.client.getSessionId().toString('hex');
    if (first) {
      this.log.debug({ zkSession: this.idHex, negotiatedTimeoutMs: this.negotiatedTimeoutMs }, 'session established');
      this.startTicking();
    } else {
      this.log.info({ zkSession: this.idHex, server: this.serverAddress }, 'reconnected, session kept');
    }
    this.emit(first ? 'connected' : 'reconnected');
  }

  private onDisconnected(): void {
    if (this.stateValue !== 'connected') return;
    this.stateValue = 'suspended';
    this.suspendedAt = now();
    const deadlineInMs = Math.max(0, this.lastAckSentAt + this.negotiatedTimeoutMs - now());
    this.log.warn({ zkSession: this.idHex, lostInMs: Math.round(deadlineInMs) }, 'disconnected: session suspended');
    this.deadlineTimer = setTimeout(() => this.declareLost('deadline'), deadlineInMs);
    this.emit('suspended');
  }

  private declareLost(reason: SessionLostReason): void {
    if (this.stateValue === 'lost' || this.stateValue === 'closed') return;
    this.stateValue = 'lost';
    this.stopTimers();
    this.rejectPending(`lost (${reason})`);
    this.terminate();
    this.log.warn({ zkSession: this.idHex, reason }, 'session lost');
    this.emit('lost', reason);
  }

  private startTicking(): void {
    this.tickMs = Math.max(20, Math.floor(this.negotiatedTimeoutMs / 12));
    this.lastTickAt = now();
    this.tickTimer = setInterval(() => this.tick(), this.tickMs);
    this.tickTimer.unref();
  }

  private tick(): void {
    const t = now();
    const T = this.negotiatedTimeoutMs;
    // After a stall of this process, timers run before pending socket reads: replies may be waiting
    // unread. Judge liveness on the next tick, after I/O has had its turn.
    const stalled = t - this.lastTickAt > 2 * this.tickMs;
    this.lastTickAt = t;
    if (this.stateValue === 'connected') {
      if (stalled && t - this.lastAckSentAt > T) {
        // This process slept through its whole lease: the server may have expired the session and
        // someone else may lead. Leadership is in doubt now, before any other timer of ours runs.
        this.dropConnection(
          `stalled past the session timeout (${Math.round(t - this.lastAckSentAt)} ms since the last acknowledged request)`,
        );
        this.onDisconnected();
        return;
      }
      if (!stalled && t - this.lastReplyAt > this.livenessTimeoutMs) {
        this.dropConnection(`no reply from server for ${Math.round(t - this.lastReplyAt)} ms`);
        return;
      }
      if (t - this.lastProbeAt >= T / 6) {
        this.lastProbeAt = t;
        this.exists('/').catch(() => {}); // a reply refreshes lastReplyAt; failures are handled by the tick
      }
    } else if (this.stateValue === 'suspended') {
      // A TCP connect that succeeded but never got a connect response would hang forever.
      const cm = this.client.connectionManager;
      if (cm.state === CM_STATE.CONNECTING && t - this.attemptStartedAt > T / 3) {
        this.attemptStartedAt = t;
        cm.socket?.destroy();
      }
    }
  }

  private stopTimers(): void {
    clearInterval(this.tickTimer);
    clearTimeout(this.deadlineTimer);
    this.tickTimer = undefined;
    this.deadlineTimer = undefined;
  }

  private rejectPending(why: string): void {
    const rejects = [...this.pending.values()];
    this.pending.clear();
    for (const r of rejects) r(new SessionLostError('request', '-', why));
  }

  /** Stops the client for good: no reconnects, socket closed (also one opened by a pending reconnect). */
  private terminate(): void {
    const cm = this.client.connectionManager;
    cm.connect = () => {};
    cm.socket?.destroy();
    // A reconnect already waiting in the client's spin delay may still open one more socket.
    setTimeout(() => cm.socket?.destroy(), 250).unref();
  }
}

function toClientAcl(acl: readonly AclEntry[]): zookeeper.ACL[] {
  return acl.map((e) => new zookeeper.ACL(e.perms, new zookeeper.Id(e.scheme, e.id)));
}
