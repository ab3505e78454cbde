// The fence as every door uses it, one per proxy (server.ts builds it; the HTTP app builds one of
// its own when run alone): the client logins writers' SQL runs as, the raise of a fence to a new
// leader's token (which ends an older token's holders after the wait, raise.ts), the read of
// whether a raise went above a token, and where refusals and commits are recorded. The object
// door, /v1/transactions and the SQL endpoint call this one object; none of them raises or
// provisions on its own.
import type pg from 'pg';
import { raiseFences, raisedAbove, type RaisedFence, type RaiseLogger } from './raise.ts';
import { provisionClientLogins, type LoginProblem, type LoginSpec, type ProvisionResult } from './client-logins.ts';
import type { RejectionLog } from './rejection-log.ts';
import type { AcceptedCounts } from './accepted-counts.ts';

export interface FenceOptions {
  /** The proxy's own pool (DATABASE_URL's role): raises, provisioning, ending holders. */
  owner: pg.Pool;
  /** Where refused writes are recorded: the store's log. */
  rejections: RejectionLog;
  /** Where committed fenced transactions are counted, per fence key (accepted-counts.ts); absent: not counted. */
  accepted?: AcceptedCounts;
  /** Login name in open mode, and prefix of the per-key logins. */
  clientRole: string;
  /** Keys whose writers run SQL (`keyName: null` for open mode). */
  logins: readonly LoginSpec[];
  /** How long an incomplete provisioning stands before the next caller tries again. */
  provisionRetryMs: number;
  /** Login problems found at provisioning (once per problem). */
  onProblem?: (keyName: string | null, problem: LoginProblem) => void;
  /** A raise waits this long for older tokens' transactions, then ends them. */
  raiseWaitMs: number;
  /** A raise fails (55P03) if the fence is still held this long after its holders were ended. */
  lockTimeoutMs: number;
  /** Where a raise says what it ended, unless the caller names a logger of its own. */
  logger?: RaiseLogger;
}

export class Fence {
  readonly owner: pg.Pool;
  readonly rejections: RejectionLog;
  readonly accepted: AcceptedCounts | null;
  private readonly opts: FenceOptions;
  private provisioned: { at: number; result: Promise<ProvisionResult> } | null = null;

  constructor(opts: FenceOptions) {
    this.opts = opts;
    this.owner = opts.owner;
    this.rejections = opts.rejections;
    this.accepted = opts.accepted ?? null;
  }

  /** Creates or checks the client logins and the fence capability (memoised; an incomplete result is tried again after a while). */
  provision(): Promise<ProvisionResult> {
    const p = this.provisioned;
    if (p && Date.now() - p.at < this.opts.provisionRetryMs) return p.result;
    const result = provisionClientLogins(this.owner, this.opts.clientRole, this.opts.logins);
    this.provisioned = { at: Date.now(), result };
    void result.then(
      (r) => {
        if (r.problems.size === 0) this.provisioned = { at: Infinity, result };
        for (const [key, problem] of r.problems) this.opts.onProblem?.(key, problem);
      },
      () => {},
    );
    return result;
  }

  /**
   * Raises each fence to its token where it is absent or below, in a transaction of the proxy's
   * own, ending older tokens' holders after `waitMs` (default: the configured wait); each fence's
   * highest token after. Rejects as raise.ts raiseFences does.
   */
  raise(
    fences: readonly { fenceKey: string; token: bigint }[],
    writerId: string | null,
    opts: { waitMs?: number; logger?: RaiseLogger } = {},
  ): Promise<RaisedFence[]> {
    const logger = opts.logger ?? this.opts.logger;
    return raiseFences(this.owner, fences, writerId, {
      waitMs: opts.waitMs ?? this.opts.raiseWaitMs,
      lockTimeoutMs: this.opts.lockTimeoutMs,
      ...(logger ? { logger } : {}),
    });
  }

  /** raise() for one fence: its highest token after (null when a raise above it won meanwhile). */
  async raiseOne(
    fenceKey: string,
    token: bigint,
    writerId: string | null,
    opts: { waitMs?: number; logger?: RaiseLogger } = {},
  ): Promise<bigint | null> {
    return (await this.raise([{ fenceKey, token }], writerId, opts))[0]!.highestToken;
  }

  /** The fence's highest token once a raise above `token` commits (waiting up to `waitMs`), else null. */
  raisedAbove(fenceKey: string, token: bigint, waitMs: number): Promise<bigint | null> {
    return raisedAbove(this.owner, fenceKey, token, waitMs);
  }

  /** How long a raise may take to commit once it ended its holders. */
  get lockTimeoutMs(): number {
    return this.opts.lockTimeoutMs;
  }
}
