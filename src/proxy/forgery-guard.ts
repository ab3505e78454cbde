// Token forgery guard (Chubby's sequencer check): before a write may RAISE a fence whose key maps
// to an election path, the proxy asks ZooKeeper whether the token is the sequence number of the
// current leader's znode there.
//
// What is accepted, and why:
// - A token t may raise a fence only if, in the guard's view of ZooKeeper, the lowest live candidate
//   under the election path (the leader; names `c_<uuid>_<join>-<%010d seq>`, see
//   src/election/sequence.ts) has sequence t. A real leader's node exists and is lowest for its whole
//   term, so its first write always passes. A made-up token, a copy of a queued (not yet leading)
//   candidate's sequence, or the token of a leader whose term is over does not: a forged huge token
//   can never raise a fence, so it cannot lock anyone out.
// - Tokens above 2^31-1 cannot be ZooKeeper sequences (an int32 counter) and are refused without
//   asking ZooKeeper.
// - A write that cannot raise the fence (t ≤ the fence's highest token) is not checked at all: the
//   fenced statement decides it (equal: accepted, below: stale). Fences only rise, so a cached or
//   just-read highest token that is ≥ t stays ≥ t: skipping the check is safe without locking.
// - Positive answers are cached per (election path, token) (bounded); negative answers are not (a
//   lagging ZooKeeper follower may not have seen the new leader yet, so a miss is re-read twice,
//   50 ms and 150 ms later, before the write is refused).
// - ZooKeeper unreachable while a raise needs checking: 503 unavailable. The hot path (token ≤
//   known highest, or a token already verified) never talks to ZooKeeper.
// - Only nodes created under the elections' identity count (src/election/acl.ts). Creating or
//   deleting a child needs CREATE or DELETE on the parent, so an election path whose ACL grants more
//   than READ to that digest identity alone, and that was created so (ACL version 0), has only ever
//   had children created by that identity. Such a path's lowest node, if ephemeral, is trusted; on
//   any other path nothing raises a fence: a planted node is never a leader. The guard's session
//   authenticates with the elections' credentials (`electionAuth`, ZK_AUTH) only so that ZooKeeper
//   shows it the ACL's digest in full (it shows `user:x` to a session that may not administer the
//   node, which would not tell the real identity from another password for the same user name);
//   it creates, deletes and changes nothing. Without `electionAuth`, nothing is trusted.
import { setTimeout as sleep } from 'node:timers/promises';
import { LRUCache } from 'lru-cache';
import type { Logger } from 'pino';
import {
  ZkSession,
  ZK_CODES,
  ZkError,
  candidateId,
  parseCandidate,
  digestId,
  formatAcl,
  isElectionAcl,
  type DigestAuth,
} from '../election/index.ts';
import { ApiError } from './errors.ts';

export interface GuardMapping {
  /** Fence keys starting with this prefix (longest prefix wins) … */
  prefix: string;
  /** … are raised only by the leader elected under this ZooKeeper path. */
  electionPath: string;
}

export interface ForgeryGuardConfig {
  zkConnect: string;
  mappings: readonly GuardMapping[];
  /** How long a check waits for a ZooKeeper session before answering 503. Default 5000. */
  connectTimeoutMs?: number;
  /**
   * The credentials the elections run with (`ZK_AUTH`, `fencepost elect --zk-auth`). Only election
   * paths whose ACL reserves creating and deleting nodes to their digest identity are trusted;
   * without them, no token raises a guarded fence.
   */
  electionAuth?: DigestAuth;
}

export interface ForgeryGuardOptions extends ForgeryGuardConfig {
  /** The fence's highest token as stored now; null when the fence does not exist. */
  readHighest: (fenceKey: string) => Promise<bigint | null>;
  logger?: Logger;
  sessionTimeoutMs?: number;
  /** Delays before re-reading after a miss. Default [50, 150]. */
  recheckDelaysMs?: readonly number[];
}

/** One mapped election, as GET /v1/elections shows it. */
export interface ElectionView {
  electionPath: string;
  fenceKeyPrefix: string;
  /** Live candidates, the leader among them. */
  candidates: number;
  /**
   * The trusted lowest candidate: its sequence is the token that may raise the fences. joinedAt:
   * its node's creation (it queued from then); seenSince: when this proxy first saw it lead (at
   * most its leadership's start; ZooKeeper keeps no time of the handover). id: the name it wrote
   * into its node (`fencepost elect --id`), null when it wrote none.
   */
  leader: { token: bigint; id: string | null; joinedAt: Date; seenSince: Date } | null;
  /** Why no node under this path is trusted; null when they are. */
  untrusted: string | null;
}

interface ElectionRead {
  candidates: number;
  leader: { seq: number; id: string | null; joinedAt: Date } | null;
  untrusted: string | null;
}

const INT32_MAX = 2n ** 31n - 1n;
const MAX_VERIFIED = 10_000;
const MAX_HIGHEST = 100_000;

export class ForgeryGuard {
  private readonly opts: ForgeryGuardOptions;
  private readonly mappings: GuardMapping[];
  private readonly verified = new LRUCache<string, true>({ max: MAX_VERIFIED });
  private readonly highest = new LRUCache<string, bigint>({ max: MAX_HIGHEST });
  private readonly inFlight = new Map<string, Promise<boolean>>();
  /** Per mapped election path, the leader elections() last saw and when it first saw it lead. */
  private readonly leaderSeen = new Map<string, { seq: number; at: Date }>();
  /** Election paths already logged as untrusted (once each). */
  private readonly untrustedLogged = new Set<string>();
  /** Why each election path is not trusted, as last read (gone once it is). */
  private readonly untrustedWhy = new Map<string, string>();
  private session: Promise<ZkSession> | null = null;
  private closed = false;
  /** ZooKeeper reads made (tests check the hot path makes none). */
  zkReads = 0;

  /** Digest ACL id of `electionAuth`; null when none is configured. */
  private readonly identity: string | null;

  constructor(opts: ForgeryGuardOptions) {
    this.opts = opts;
    this.identity = opts.electionAuth ? digestId(opts.electionAuth) : null;
    this.mappings = [...opts.mappings].sort((a, b) => b.prefix.length - a.prefix.length);
  }

  /** Every guarded fence-key prefix (the SQL endpoint hands them to its fence). */
  get prefixes(): readonly string[] {
    return this.mappings.map((m) => m.prefix);
  }

  /** Is `fenceKey` guarded? */
  guards(fenceKey: string): boolean {
    return this.pathFor(fenceKey) !== null;
  }

  /** The election path guarding `fenceKey`, or null when it is not guarded. */
  pathFor(fenceKey: string): string | null {
    return this.mappings.find((m) => fenceKey.startsWith(m.prefix))?.electionPath ?? null;
  }

  /**
   * An object under a guarded prefix may only be written under a fence key guarded by the same
   * election: otherwise a forger could name an unguarded fence key with a huge token, moving the
   * object to that fence, whose highest token (the object rule, see sql/objects.ts) would then lock the
   * real leader out of it.
   */
  admitObject(objectKey: string, fenceKey: string, token: bigint): void {
    const path = this.pathFor(objectKey);
    if (path === null || this.pathFor(fenceKey) === path) return;
    throw new ApiError(
      'unverified_token',
      `object ${JSON.stringify(objectKey)} is guarded by the election under ${path}; its fence key must be guarded by the same election`,
      {
        fenceKey,
        token: token.toString(),
        electionPath: path,
      },
    );
  }

  /**
   * Resolves when the write may go ahead; throws 409 unverified_token when it would raise the fence
   * with a token that is not the current leader's, 503 unavailable when ZooKeeper cannot answer.
   */
  async admit(fenceKey: string, token: bigint): Promise<void> {
    const path = this.pathFor(fenceKey);
    if (path === null) return;
    const id = `${path}\u0000${token}`;
    if (this.verified.has(id)) return;
    const known = this.highest.get(fenceKey);
    if (known !== undefined && token <= known) return;
    const stored = await this.opts.readHighest(fenceKey);
    if (stored !== null) this.highest.set(fenceKey, stored);
    if (stored !== null && token <= stored) return;
    if (await this.isLeaderToken(path, token)) {
      this.verified.set(id, true);
      return;
    }
    const untrusted = this.untrustedWhy.get(path);
    if (untrusted !== undefined) {
      // A configuration problem, not a forged token: say what to fix.
      throw new ApiError(
        'unverified_token',
        `election path ${path} not trusted: ${untrusted}; no token from it raises fence ${JSON.stringify(fenceKey)} (use a new election path, created with ZK_AUTH)`,
        {
          fenceKey,
          token: token.toString(),
          electionPath: path,
          untrusted,
        },
      );
    }
    this.opts.logger?.warn(
      { fenceKey, token: token.toString(), electionPath: path },
      "forgery guard refused a token that is not the leader's",
    );
    throw new ApiError(
      'unverified_token',
      `token ${token} would raise fence ${JSON.stringify(fenceKey)} but is not the sequence of the current leader under ${path}`,
      {
        fenceKey,
        token: token.toString(),
        electionPath: path,
      },
    );
  }

  /** True if the lowest live candidate under `path` has sequence `token` (re-read on a miss). */
  private isLeaderToken(path: string, token: bigint): Promise<boolean> {
    if (token > INT32_MAX) return Promise.resolve(false);
    const id = `${path}\u0000${token}`;
    let p = this.inFlight.get(id);
    if (!p) {
      p = (async () => {
        const delays = this.opts.recheckDelaysMs ?? [50, 150];
        for (let i = 0; ; i++) {
          if ((await this.leaderSequence(path)) === Number(token)) return true;
          const d = delays[i];
          if (d === undefined) return false;
          await sleep(d);
        }
      })().finally(() => this.inFlight.delete(id));
      this.inFlight.set(id, p);
    }
    return p;
  }

  /** The sequence of the lowest candidate under `path`, if it is a node the election identity made. */
  private async leaderSequence(path: string): Promise<number | null> {
    const view = await this.readElection(path, 'cannot verify a token that raises a fence; safe to retry');
    if (view.untrusted !== null) this.untrusted(path, view.untrusted);
    else this.untrustedWhy.delete(path);
    return view.leader?.seq ?? null;
  }

  /**
   * Every mapped election as the guard sees it now (GET /v1/elections): who leads, since when, how
   * many queue. Throws 503 unavailable when ZooKeeper cannot answer.
   */
  async elections(): Promise<ElectionView[]> {
    const byPath = new Map<string, Promise<ElectionRead>>();
    const views = this.mappings.map(async (m) => {
      let read = byPath.get(m.electionPath);
      if (!read) byPath.set(m.electionPath, (read = this.readElection(m.electionPath, 'cannot read the elections')));
      const r = await read;
      let leader: ElectionView['leader'] = null;
      if (r.leader) {
        let seen = this.leaderSeen.get(m.electionPath);
        if (seen?.seq !== r.leader.seq) this.leaderSeen.set(m.electionPath, (seen = { seq: r.leader.seq, at: new Date() }));
        leader = { token: BigInt(r.leader.seq), id: r.leader.id, joinedAt: r.leader.joinedAt, seenSince: seen.at };
      }
      return { electionPath: m.electionPath, fenceKeyPrefix: m.prefix, candidates: r.candidates, leader, untrusted: r.untrusted };
    });
    return (await Promise.all(views)).sort((a, b) =>
      a.electionPath === b.electionPath ? a.fenceKeyPrefix.localeCompare(b.fenceKeyPrefix) : a.electionPath < b.electionPath ? -1 : 1,
    );
  }

  /**
   * The lowest candidate under `path`, when it is an ephemeral node the election identity made (a
   * path whose ACL lets anyone else create or delete nodes has no trusted leader: `untrusted` says
   * why). A missing path is an election nobody has joined.
   */
  private async readElection(path: string, unavailable: string): Promise<ElectionRead> {
    const identity = this.identity;
    if (identity === null)
      return { candidates: 0, leader: null, untrusted: 'no election identity is configured (ZK_AUTH): no election node is trusted' };
    try {
      const s = await this.zk();
      this.zkReads++;
      const { children } = await s.getChildren(path);
      let lowest: { name: string; seq: number } | null = null;
      let candidates = 0;
      for (const name of children) {
        let seq: number;
        try {
          const c = parseCandidate(name);
          if (!c) continue;
          seq = c.seq;
        } catch {
          continue; // a wrapped sequence is never a valid token
        }
        candidates++;
        if (lowest === null || seq < lowest.seq) lowest = { name, seq };
      }
      if (lowest === null) return { candidates, leader: null, untrusted: null };
      // Who could have made that node: only the identity, if the path's ACL says so and always has.
      const { acl, stat } = await s.getAcl(path);
      if (!isElectionAcl(acl, identity) || stat.aversion !== 0) {
        const why =
          stat.aversion !== 0
            ? `its ACL was changed after it was created (ACL version ${stat.aversion}): nodes planted before the change may remain`
            : `created without these credentials (ACL): its ACL (${formatAcl(acl)}) lets others than the election identity create or delete nodes`;
        return { candidates, leader: null, untrusted: why };
      }
      // Its data names it (the candidate's id), in the same round trip as its stat.
      let node: { data: Buffer | undefined; stat: { ephemeralOwner: Buffer; ctime: Buffer } };
      try {
        node = await s.getData(`${path}/${lowest.name}`);
      } catch (err) {
        if (err instanceof ZkError && err.code === ZK_CODES.NO_NODE) return { candidates, leader: null, untrusted: null }; // gone meanwhile
        throw err;
      }
      // not a candidate's
      if (node.stat.ephemeralOwner.every((b) => b === 0)) return { candidates, leader: null, untrusted: null };
      const joinedAt = new Date(Number(node.stat.ctime.readBigInt64BE(0)));
      return { candidates, leader: { seq: lowest.seq, id: candidateId(node.data), joinedAt }, untrusted: null };
    } catch (err) {
      if (err instanceof ZkError && err.code === ZK_CODES.NO_NODE) return { candidates: 0, leader: null, untrusted: null };
      throw new ApiError('unavailable', `ZooKeeper unreachable: ${unavailable}`, {}, { cause: err });
    }
  }

  private untrusted(path: string, why: string): void {
    this.untrustedWhy.set(path, why);
    if (this.untrustedLogged.has(path)) return;
    this.untrustedLogged.add(path);
    this.opts.logger?.error({ electionPath: path }, `forgery guard: election path not trusted, no token from it raises a fence: ${why}`);
  }

  private async zk(): Promise<ZkSession> {
    if (this.closed) throw new Error('forgery guard closed');
    const current = this.session;
    if (current) {
      const s = await current;
      if (s.state === 'connected' || s.state === 'suspended' || s.state === 'connecting') return s;
      if (this.session === current) this.session = null;
    }
    this.session ??= ZkSession.open({
      connect: this.opts.zkConnect,
      sessionTimeoutMs: this.opts.sessionTimeoutMs ?? 10_000,
      connectTimeoutMs: this.opts.connectTimeoutMs ?? 5000,
      requestTimeoutMs: 5000,
      ...(this.opts.logger ? { logger: this.opts.logger } : {}),
      ...(this.opts.electionAuth ? { auth: this.opts.electionAuth } : {}),
    });
    const opening = this.session;
    try {
      return await opening;
    } catch (err) {
      if (this.session === opening) this.session = null;
      throw err;
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    const s = this.session;
    this.session = null;
    if (s) await (await s.catch(() => null))?.close();
  }
}
