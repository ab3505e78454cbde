// Leader election through ZooKeeper ephemeral sequential znodes; the leader's sequence number is
// its fencing token.
//
// Recipe (Curator's LeaderLatch, hardened):
// - Each candidate creates EPHEMERAL_SEQUENTIAL `<path>/c_<uuid>_<join>-<seq>`. The path and its
//   parents are PERSISTENT (a container node could be deleted when empty and recreated with its
//   sequence counter back at zero, which would hand out old tokens again).
// - Lowest sequence leads; every other candidate watches only its immediate predecessor.
// - Protected create: after a create whose reply was lost, the node is found again by <uuid>; a node
//   of ours owned by an older session is deleted.
// - Before calling itself leader a candidate checks that its node's ephemeralOwner is its session.
// - All work happens in one loop (run()); ZooKeeper watches and connection events only wake it, so
//   there is never more than one step in flight. Leadership is revoked synchronously from connection
//   events, though: a term's AbortSignal fires the moment leadership is in doubt.
import { EventEmitter } from 'node:events';
import { randomUUID } from 'node:crypto';
import zookeeper from 'node-zookeeper-client';
import type { Logger } from 'pino';
import { pino } from 'pino';
import {
  ElectionAbortedError,
  ElectionAccessError,
  LeadershipRevokedError,
  SequenceOverflowError,
  ZK_CODES,
  ZkError,
  coerceError,
} from './errors.ts';
import {
  SEQUENCE_WARN_REMAINING,
  candidatePrefix,
  checkParentCversion,
  defaultCandidateId,
  electionPathProblem,
  parseCandidate,
  sortCandidates,
} from './sequence.ts';
import type { CandidateNode } from './sequence.ts';
import { ZkSession } from './zk-session.ts';
import type { SessionLostReason } from './zk-session.ts';
import { digestId, electionAcl, formatAcl, isElectionAcl } from './acl.ts';
import type { AclEntry, DigestAuth } from './acl.ts';

/**
 * What a disconnection means for the leader.
 * - `suspend-is-lost` (default): leadership ends the moment the connection drops; on reconnect the
 *   candidate rejoins with a new node (and so a new token). Safe: the old term is over before the
 *   server can possibly expire the session and elect someone else.
 * - `wait-for-expiry`: the leader keeps its term while disconnected and only loses it when the session
 *   is lost (our clock says it may have expired, or the server says it did). Fewer handovers on network
 *   blips, but the term can overlap the next leader's by the clock error: only fencing makes that safe.
 */
export type ElectionPolicy = 'suspend-is-lost' | 'wait-for-expiry';
export type RevokeReason = 'suspended' | 'lost' | 'resigned' | 'closed';
export type ConnectionState = 'connected' | 'suspended' | 'reconnected' | 'lost';

export interface ElectionOptions {
  /** ZooKeeper connect string, e.g. `zk1:2181,zk2:2181,zk3:2181`. */
  connect: string;
  /** Election path, e.g. `/fencepost/elections/orders-writer`. */
  path: string;
  /** Human-readable candidate id, reported by `leader()`. Default: `<hostname>-<pid>`. */
  id?: string;
  /** Requested ZooKeeper session timeout. Default 10 000 ms. */
  sessionTimeoutMs?: number;
  policy?: ElectionPolicy;
  /** pino logger; silent when omitted. */
  logger?: Logger;
  /**
   * Digest credentials (`--zk-auth` / `ZK_AUTH`). With them, the election path, the parents this
   * candidate creates and its candidate nodes get the election ACL (all permissions for this
   * identity, read for everyone: see acl.ts), so nobody else can plant or delete candidates.
   * Without them, nodes are open to anyone who reaches ZooKeeper.
   */
  auth?: DigestAuth;
  /** Test seam: fixes the candidate uuid (to play a restarted candidate that finds its old node). */
  __test__uuid?: string;
}

export interface LeaderInfo {
  id: string;
  token: bigint;
}

export interface ElectionStats {
  /** Watch notifications received (the herd test counts these). */
  watchNotifications: number;
  /** Terms begun by this candidate. */
  terms: number;
  /** ZooKeeper sessions opened by this candidate. */
  sessions: number;
}

export interface ElectionEvents {
  elected: [{ token: bigint }];
  revoked: [{ token: bigint; reason: RevokeReason }];
  connection: [{ state: ConnectionState; sessionId: string; reason?: SessionLostReason }];
  /** A fatal condition (sequence overflow): the election has stopped. Emitted only if listened to. */
  error: [Error];
}

interface Term {
  token: bigint;
  controller: AbortController;
  log: Logger;
}

interface Waiter {
  resolve: (token: bigint) => void;
  reject: (err: Error) => void;
}

const NOT_LEADER_SIGNAL = AbortSignal.abort(new LeadershipRevokedError(null, 'not leader'));
const DEFAULT_SESSION_TIMEOUT_MS = 10_000;

export class Election extends EventEmitter<ElectionEvents> {
  readonly path: string;
  readonly id: string;
  readonly policy: ElectionPolicy;
  readonly sessionTimeoutMs: number;
  /** Fixed per Election object; carried in every node name (protected mode). */
  readonly uuid: string;
  private readonly connect: string;
  private readonly log: Logger;
  private readonly auth: DigestAuth | undefined;
  /** ACL of every node this candidate creates; undefined = ZooKeeper's default (world, all). */
  private readonly acl: AclEntry[] | undefined;
  private pathAclChecked = false;
  private session: ZkSession | null = null;
  private node: CandidateNode | null = null;
  /** Join number of a create that was sent but not confirmed (its node may exist). */
  private pendingJoin: number | null = null;
  private joinCount = 0;
  /** Delete our node and rejoin at the back (after resign, or after leading through a suspension). */
  private retire = false;
  private term: Term | null = null;
  private lastToken: bigint | null = null;
  private started = false;
  private closing = false;
  private failure: Error | null = null;
  private readonly closeController = new AbortController();
  private loopDone: Promise<void> = Promise.resolve();
  private closePromise: Promise<void> | null = null;
  private wakePending = false;
  private wakeResolve: (() => void) | null = null;
  private readonly leadershipWaiters = new Set<Waiter>();
  private retireWaiters: Array<() => void> = [];
  private readyResolve: (() => void) | null = null;
  private readyReject: ((err: Error) => void) | null = null;
  private cversionWarned = false;
  private readonly statsValue: ElectionStats = { watchNotifications: 0, terms: 0, sessions: 0 };

  constructor(opts: ElectionOptions) {
    super();
    const pathProblem = electionPathProblem(opts.path);
    if (pathProblem !== null) throw new Error(`election path ${pathProblem}, got ${JSON.stringify(opts.path)}`);
    this.connect = opts.connect;
    this.path = opts.path;
    this.id = opts.id ?? defaultCandidateId();
    this.policy = opts.policy ?? 'suspend-is-lost';
    this.sessionTimeoutMs = opts.sessionTimeoutMs ?? DEFAULT_SESSION_TIMEOUT_MS;
    this.uuid = opts.__test__uuid ?? randomUUID();
    this.log = (opts.logger ?? pino({ level: 'silent' })).child({ electionPath: this.path, candidateId: this.id });
    this.auth = opts.auth;
    this.acl = opts.auth ? electionAcl(digestId(opts.auth)) : undefined;
  }

  /** True while this candidate holds a term. */
  get isLeader(): boolean {
    return this.term !== null;
  }
  /** Fencing token of the current term, or null when not leading. */
  get token(): bigint | null {
    return this.term?.token ?? null;
  }
  /** Aborts the moment the current term ends; already aborted when not leading. */
  get signal(): AbortSignal {
    return this.term?.controller.signal ?? NOT_LEADER_SIGNAL;
  }
  /** Full path of this candidate's znode, or null while it has none. */
  get nodePath(): string | null {
    return this.node ? `${this.path}/${this.node.name}` : null;
  }
  /** The current ZooKeeper session (diagnostics and tests). */
  get currentSession(): ZkSession | null {
    return this.session;
  }
  get stats(): Readonly<ElectionStats> {
    return { ...this.statsValue };
  }

  /**
   * Connects, creates the election path if needed and joins. Resolves once this candidate has a node
   * (not once it is elected: see `waitForLeadership`). Rejects if ZooKeeper cannot be reached.
   */
  async start(): Promise<void> {
    if (this.started) throw new Error('election already started');
    this.started = true;
    const ready = new Promise<void>((resolve, reject) => {
      this.readyResolve = resolve;
      this.readyReject = reject;
    });
    ready.catch(() => {}); // observed below; a close() before start() returns must not be unhandled
    try {
      await this.ensureSession(); // fail fast on an unreachable ensemble
    } catch (err) {
      this.readyReject = null;
      throw accessError(err, this.path) ?? err;
    }
    this.loopDone = this.run();
    await ready;
  }

  /** Resolves with the token once this candidate leads (at once if it does). */
  waitForLeadership(signal?: AbortSignal): Promise<bigint> {
    if (this.term) return Promise.resolve(this.term.token);
    if (this.failure) return Promise.reject(this.failure);
    if (this.closing) return Promise.reject(new ElectionAbortedError('election closed'));
    if (signal?.aborted) return Promise.reject(new ElectionAbortedError('aborted', { cause: signal.reason }));
    return new Promise<bigint>((resolve, reject) => {
      const onAbort = (): void => {
        this.leadershipWaiters.delete(waiter);
        reject(new ElectionAbortedError('aborted', { cause: signal?.reason }));
      };
      const waiter: Waiter = {
        resolve: (t) => {
          signal?.removeEventListener('abort', onAbort);
          resolve(t);
        },
        reject: (e) => {
          signal?.removeEventListener('abort', onAbort);
          reject(e);
        },
      };
      this.leadershipWaiters.add(waiter);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /**
   * Waits to lead, then runs `fn(signal, token)` once. `signal` aborts when the term ends (or when
   * `opts.signal` aborts); `fn` must stop acting on the resource then. Returns what `fn` returns.
   * If the term ends before `fn` starts, it waits for the next term.
   */
  async runWhileLeader<T>(fn: (signal: AbortSignal, token: bigint) => Promise<T>, opts: { signal?: AbortSignal } = {}): Promise<T> {
    for (;;) {
      const token = await this.waitForLeadership(opts.signal);
      const term = this.term;
      if (!term || term.token !== token) continue; // revoked before we got here
      const signal = opts.signal ? AbortSignal.any([term.controller.signal, opts.signal]) : term.controller.signal;
      return await fn(signal, token);
    }
  }

  /** Observes the current leader: the lowest candidate's id and token, or null when there is none. */
  async leader(): Promise<LeaderInfo | null> {
    const s = this.session;
    if (!s) throw new Error('election not started or its session is being replaced');
    return await readLeader(s, this.path);
  }

  /**
   * Ends the current term at once and deletes this candidate's node, so the next candidate takes over
   * immediately; this candidate rejoins at the back of the queue. No-op when not leading.
   */
  async resign(): Promise<void> {
    if (!this.term) return;
    this.retire = true;
    const retired = new Promise<void>((resolve) => this.retireWaiters.push(resolve));
    this.endTerm('resigned');
    this.wake();
    await retired;
  }

  /** Leaves the election: ends the term, closes the session (its node vanishes with it). */
  close(): Promise<void> {
    this.closePromise ??= this.doClose();
    return this.closePromise;
  }

  private async doClose(): Promise<void> {
    this.closing = true;
    this.endTerm('closed');
    this.closeController.abort();
    this.rejectWaiters(new ElectionAbortedError('election closed'));
    this.resolveRetireWaiters();
    this.readyReject?.(new ElectionAbortedError('election closed before it joined'));
    const s = this.session;
    this.session = null;
    this.wake();
    if (s) await s.close();
    await this.loopDone;
    this.log.info('left the election');
  }

  // ---- the loop -------------------------------------------------------------------------------

  private async run(): Promise<void> {
    let backoffMs = 0;
    while (!this.closing && !this.failure) {
      try {
        const s = await this.ensureSession();
        if (this.retire && this.node) await this.retireNode(s);
        if (!this.node) await this.join(s);
        this.readyResolve?.();
        this.readyResolve = null;
        await this.check(s);
        backoffMs = 0;
      } catch (err) {
        if (this.closing) break;
        const e = accessError(err, this.path) ?? coerceError(err);
        if (e instanceof SequenceOverflowError || e instanceof ElectionAccessError) {
          this.fail(e);
          break;
        }
        backoffMs = Math.min(Math.max(backoffMs * 2, 50), 1000);
        this.log.warn({ err: e, retryInMs: backoffMs }, 'election step failed; retrying');
        await this.waitForWake(backoffMs);
        continue;
      }
      await this.waitForWake();
    }
  }

  private async ensureSession(): Promise<ZkSession> {
    const current = this.session;
    if (current && (current.state === 'connected' || current.state === 'suspended')) return current;
    const s = await ZkSession.open({
      connect: this.connect,
      sessionTimeoutMs: this.sessionTimeoutMs,
      logger: this.log,
      signal: this.closeController.signal,
      ...(this.auth ? { auth: this.auth } : {}),
    });
    if (this.closing) {
      await s.close();
      throw new ElectionAbortedError('election closed');
    }
    this.statsValue.sessions++;
    this.session = s;
    this.node = null;
    this.pendingJoin = null;
    this.retire = false;
    s.on('suspended', () => this.onSuspended(s));
    s.on('reconnected', () => this.onReconnected(s));
    s.on('lost', (reason) => this.onLost(s, reason));
    this.log.info({ zkSession: s.sessionId, negotiatedTimeoutMs: s.negotiatedTimeoutMs }, 'connected to ZooKeeper');
    this.emit('connection', { state: 'connected', sessionId: s.sessionId });
    await s.mkdirp(this.path, this.acl);
    if (!this.pathAclChecked) {
      this.pathAclChecked = true;
      await this.checkPathAcl(s);
    }
    return s;
  }

  /** Says so, once, when others could plant or delete candidates under the election path. */
  private async checkPathAcl(s: ZkSession): Promise<void> {
    if (!this.auth) {
      this.log.warn('no ZooKeeper credentials (--zk-auth / ZK_AUTH): anyone who reaches ZooKeeper can plant or delete election nodes');
      return;
    }
    const { acl, stat } = await s.getAcl(this.path);
    const identity = digestId(this.auth);
    if (!isElectionAcl(acl, identity) || stat.aversion !== 0) {
      this.log.error(
        {
          acl: formatAcl(acl.map((e) => (e.scheme === 'digest' && e.id === identity ? { ...e, id: `${this.auth!.user}:…` } : e))),
          aclVersion: stat.aversion,
          zkUser: this.auth.user,
        },
        stat.aversion !== 0
          ? "the election path's ACL was changed after it was created: nodes planted before the change may remain, so the forgery guard will not trust this path; use a new election path"
          : 'the election path exists with an ACL that lets others create or delete candidates (it was created without these credentials): the forgery guard will not trust it; use a new election path',
      );
    }
  }

  /** Protected create: adopt our node if an earlier create got through, else create one. */
  private async join(s: ZkSession): Promise<void> {
    let children: string[];
    try {
      ({ children } = await s.getChildren(this.path));
    } catch (err) {
      if (!(err instanceof ZkError && err.code === ZK_CODES.NO_NODE)) throw err;
      await s.mkdirp(this.path);
      ({ children } = await s.getChildren(this.path));
    }
    for (const name of children) {
      const c = parseCandidate(name);
      if (!c || c.uuid !== this.uuid) continue;
      const full = `${this.path}/${name}`;
      const stat = await s.exists(full);
      if (!stat) continue;
      if (!this.node && s.owns(stat) && c.join === this.pendingJoin) {
        this.node = c;
        this.pendingJoin = null;
        this.log.info({ node: full }, 'found our node again after an unconfirmed create');
      } else {
        await s.remove(full);
        this.log.info({ node: full, ownSession: s.owns(stat) }, 'deleted a stale node of ours');
      }
    }
    if (this.node) return;
    this.pendingJoin ??= ++this.joinCount;
    const data = Buffer.from(JSON.stringify({ id: this.id }));
    const created = await s.create(
      `${this.path}/${candidatePrefix(this.uuid, this.pendingJoin)}`,
      data,
      zookeeper.CreateMode.EPHEMERAL_SEQUENTIAL,
      this.acl,
    );
    const node = parseCandidate(created.slice(created.lastIndexOf('/') + 1));
    if (!node) throw new Error(`unexpected node name from create: ${created}`);
    if (this.session !== s) return; // session replaced meanwhile; that node dies with its session
    this.node = node;
    this.pendingJoin = null;
    this.log.debug({ node: created }, 'joined');
  }

  /** Leads if first (and the node is ours); otherwise watches the predecessor. */
  private async check(s: ZkSession): Promise<void> {
    const node = this.node;
    if (!node) return;
    const { children, stat } = await s.getChildren(this.path);
    const { remaining } = checkParentCversion(stat.cversion);
    if (remaining < SEQUENCE_WARN_REMAINING && !this.cversionWarned) {
      this.cversionWarned = true;
      this.log.warn({ remaining }, 'election sequence counter is close to wrapping (int32)');
    }
    const sorted = sortCandidates(children);
    if (this.node !== node || this.session !== s) return;
    const idx = sorted.findIndex((c) => c.name === node.name);
    if (idx < 0) {
      this.log.warn({ node: node.name }, 'our node disappeared; rejoining');
      this.node = null;
      this.endTerm('lost');
      this.wake();
      return;
    }
    if (idx === 0) {
      if (this.term || this.retire) return;
      const own = await s.exists(`${this.path}/${node.name}`);
      if (this.node !== node || this.session !== s || this.closing || this.retire) return;
      if (!own || !s.owns(own)) {
        this.log.warn({ node: node.name, exists: own !== null }, 'our node is gone or owned by another session; rejoining');
        this.node = null;
        this.wake();
        return;
      }
      if (s.state !== 'connected') return; // the reconnect wakes us again
      this.beginTerm(BigInt(node.seq));
      return;
    }
    if (this.term) {
      // Cannot happen while sequences only rise; refuse to keep leading behind someone.
      this.log.error({ node: node.name, first: sorted[0]?.name }, 'a lower node appeared while leading');
      this.endTerm('lost');
    }
    const pred = sorted[idx - 1]!;
    const predStat = await s.exists(`${this.path}/${pred.name}`, this.onWatch);
    if (!predStat) this.wake(); // already gone: look again
  }

  private async retireNode(s: ZkSession): Promise<void> {
    const node = this.node;
    if (node) await s.remove(`${this.path}/${node.name}`);
    if (this.node === node) this.node = null;
    this.retire = false;
    this.resolveRetireWaiters();
  }

  // ---- terms and events ---------------------------------------------------------------------

  private beginTerm(token: bigint): void {
    if (this.lastToken !== null && token <= this.lastToken) {
      this.fail(new SequenceOverflowError(`token ${token} is not above the previous token ${this.lastToken}`));
      return;
    }
    this.lastToken = token;
    this.statsValue.terms++;
    const log = this.log.child({ token: token.toString() });
    this.term = { token, controller: new AbortController(), log };
    log.info({ zkSession: this.session?.sessionId }, 'elected');
    const waiters = [...this.leadershipWaiters];
    this.leadershipWaiters.clear();
    for (const w of waiters) w.resolve(token);
    this.emit('elected', { token });
  }

  private endTerm(reason: RevokeReason): void {
    const term = this.term;
    if (!term) return;
    this.term = null;
    term.controller.abort(new LeadershipRevokedError(term.token, reason));
    term.log.info({ reason }, 'leadership revoked');
    this.emit('revoked', { token: term.token, reason });
  }

  private onSuspended(s: ZkSession): void {
    if (this.session !== s) return;
    if (this.policy === 'suspend-is-lost' && this.term) {
      this.retire = true;
      this.endTerm('suspended');
    }
    this.emit('connection', { state: 'suspended', sessionId: s.sessionId });
    this.wake();
  }

  private onReconnected(s: ZkSession): void {
    if (this.session !== s) return;
    this.emit('connection', { state: 'reconnected', sessionId: s.sessionId });
    this.wake();
  }

  private onLost(s: ZkSession, reason: SessionLostReason): void {
    if (this.session !== s) return;
    this.session = null;
    this.node = null;
    this.pendingJoin = null;
    this.retire = false;
    this.endTerm('lost');
    this.resolveRetireWaiters();
    this.emit('connection', { state: 'lost', sessionId: s.sessionId, reason });
    this.wake();
  }

  private readonly onWatch = (): void => {
    this.statsValue.watchNotifications++;
    this.wake();
  };

  private fail(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    this.log.error({ err }, 'election stopped');
    this.endTerm('lost');
    this.rejectWaiters(err);
    this.readyReject?.(err);
    const s = this.session;
    this.session = null;
    void s?.close();
    if (this.listenerCount('error') > 0) this.emit('error', err);
  }

  private rejectWaiters(err: Error): void {
    const waiters = [...this.leadershipWaiters];
    this.leadershipWaiters.clear();
    for (const w of waiters) w.reject(err);
  }

  private resolveRetireWaiters(): void {
    const ws = this.retireWaiters;
    this.retireWaiters = [];
    for (const r of ws) r();
  }

  private wake(): void {
    this.wakePending = true;
    const r = this.wakeResolve;
    this.wakeResolve = null;
    r?.();
  }

  private async waitForWake(timeoutMs?: number): Promise<void> {
    if (!this.wakePending) {
      await new Promise<void>((resolve) => {
        const timer = timeoutMs === undefined ? undefined : setTimeout(resolve, timeoutMs);
        this.wakeResolve = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    this.wakePending = false;
  }
}

/** NoAuth from ZooKeeper as the fatal ElectionAccessError it is; null for anything else. */
function accessError(err: unknown, path: string): ElectionAccessError | null {
  if (!(err instanceof ZkError) || err.code !== ZK_CODES.NO_AUTH) return null;
  return new ElectionAccessError(
    `ZooKeeper refused to ${err.op} ${err.path} (NoAuth): the ACL of ${path} or a parent does not let these credentials create or delete election nodes; check --zk-auth / ZK_AUTH`,
    { cause: err },
  );
}

/** The lowest candidate under `path` (the leader, or the one about to be), or null if none. */
export async function readLeader(s: ZkSession, path: string): Promise<LeaderInfo | null> {
  for (let attempt = 0; attempt < 10; attempt++) {
    let children: string[];
    try {
      ({ children } = await s.getChildren(path));
    } catch (err) {
      if (err instanceof ZkError && err.code === ZK_CODES.NO_NODE) return null;
      throw err;
    }
    const first = sortCandidates(children)[0];
    if (!first) return null;
    try {
      const { data } = await s.getData(`${path}/${first.name}`);
      return { id: candidateId(data) ?? first.uuid, token: BigInt(first.seq) };
    } catch (err) {
      if (err instanceof ZkError && err.code === ZK_CODES.NO_NODE) continue; // it left meanwhile
      throw err;
    }
  }
  throw new Error(`the leader of ${path} kept changing while being read`);
}

/** The id a candidate wrote into its node (`{"id": …}`, as Election.start does); null when it wrote none. */
export function candidateId(data: Buffer | undefined): string | null {
  if (!data || data.length === 0) return null;
  try {
    const v = JSON.parse(data.toString('utf8')) as { id?: unknown };
    return typeof v.id === 'string' ? v.id : null;
  } catch {
    return null;
  }
}
