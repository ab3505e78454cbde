// One writer's session after authentication: its connection is fenced once, on its own backend,
// before the writer hears that the session is ready (the fence decides: src/fence/session-fence.ts;
// fencer.ts words its refusals); then the relay carries the
// writer's messages and the database's answers as they are (relay.ts). A newer leader's raise ends
// the backend (the database does: definitions.ts revoke_older_sessions); the writer then hears
// FP409 and the connection closes. While writes are refused for durability
// (FENCEPOST_REQUIRE_SYNC_STANDBY), fenced sessions are ended and new ones refused (FP533).
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import type { MessageReader } from './wire/framing.ts';
import { errorResponse, type ErrorFields } from './wire/backend.ts';
import { Relay, type TransactionEnd } from './relay.ts';
import { durabilityRefusal, refusalFields, refusalOutcome, revokedFields } from './fencer.ts';
import { fenceQuestions, type Backend } from './backend.ts';
import type { Fence, FencePair, FenceSettings, SessionFence, SessionGuard } from '../../fence/index.ts';

export type { TransactionEnd } from './relay.ts';

/** A stale token refused: counted and logged as every door's refusals are. */
export interface StaleRefusal {
  fenceKey: string;
  token: bigint;
  highestToken: bigint | null;
}

export interface SessionOptions {
  logger: Logger;
  /** The fence: it decides the connection's fence (enterSession) and says whether a raise ended it (raisedAbove). */
  fence: Pick<Fence, 'enterSession' | 'raisedAbove'>;
  capability: string;
  /** May the key write this fence key? (its fence-key prefixes) */
  mayWrite: (fenceKey: string) => boolean;
  /** The forgery guard; null or absent: none. */
  guard?: SessionGuard | null;
  /** fencepost.token and fencepost.fence_key from the startup settings. */
  startupSettings: FenceSettings;
  /** The writer, for the raise's record. */
  writerId: string;
  /**
   * At most how long a backend ended by an administrator (57P01) waits for the raise in flight on
   * its fence to commit (raise.ts raisedAbove: the wait is a lock wait on the fence row, so it ends
   * when that raise commits). With no raise in flight (an operator's pg_terminate_backend) the
   * writer hears Postgres's own words at once.
   */
  raiseCommitMs: number;
  /** The startup fence's statements must be answered within this. */
  fenceTimeoutMs: number;
  onStale: (refusal: StaleRefusal) => void;
  /** Writes refused while a failover could lose a fence raise (src/fence/durability-monitor.ts); null or absent: never. */
  durability?: { refusal(): unknown; onChange(listener: () => void): () => void } | null;
  /** Each transaction's end of a fenced session, with its fence key (relay.ts TransactionEnd); absent: not counted. */
  onTransactionEnd?: (end: TransactionEnd, fenceKey: string) => void;
  /** A connection refused for another reason than a stale token (fencer.ts refusalOutcome). */
  onFenceError?: (outcome: 'error' | 'invalid') => void;
  /** The connection is fenced (or needs no fence): tell the writer its session is ready. */
  ready: () => void;
  onClose: () => void;
}

export class SqlSession {
  private relay: Relay | null = null;
  private unwatch: () => void = () => {};

  constructor(
    private readonly client: Socket,
    private readonly clientReader: MessageReader,
    private readonly backend: Backend,
    private readonly opts: SessionOptions,
  ) {}

  /** Fences the connection, then tells the writer it is ready and relays; or refuses it. */
  async start(): Promise<void> {
    const opts = this.opts;
    const refusing = () => opts.durability !== null && opts.durability !== undefined && opts.durability.refusal() !== null;
    let fence: SessionFence;
    try {
      fence = await opts.fence.enterSession(
        {
          settings: opts.startupSettings,
          mayWrite: opts.mayWrite,
          guard: opts.guard ?? null,
          refusing: refusing(),
          capability: opts.capability,
          writerId: opts.writerId,
          logger: opts.logger,
        },
        fenceQuestions(this.backend, opts.fenceTimeoutMs),
      );
    } catch (err) {
      opts.logger.warn({ err }, 'SQL connection: the fence could not be decided; it is refused');
      opts.onFenceError?.('error');
      this.refuse({
        severity: 'FATAL',
        code: '08006',
        message: "the connection's fence could not be decided",
        hint: 'nothing was applied; connect again',
      });
      return;
    }
    if (fence.kind === 'refused') {
      const r = fence.refusal;
      if (r.reason === 'stale' || r.reason === 'unverified')
        opts.onStale({ fenceKey: r.fenceKey, token: r.token, highestToken: r.highestToken });
      const outcome = refusalOutcome(r);
      if (outcome) opts.onFenceError?.(outcome);
      this.refuse(refusalFields(r));
      return;
    }
    const pair = fence.kind === 'fenced' ? fence.pair : null;
    this.relay = new Relay(this.client, this.clientReader, this.backend, {
      logger: opts.logger,
      ...(pair !== null && opts.onTransactionEnd
        ? { onTransactionEnd: (end: TransactionEnd) => opts.onTransactionEnd!(end, pair.fenceKey) }
        : {}),
      lostReason: (terminated) => this.lostReason(pair, terminated),
      onClose: () => {
        this.unwatch();
        opts.onClose();
      },
    });
    if (pair !== null && opts.durability) {
      this.unwatch = opts.durability.onChange(() => {
        if (refusing()) this.relay?.revoke(durabilityRefusal());
      });
    }
    opts.ready();
    this.relay.start();
  }

  /** The writer's answer to its startup is this refusal; the backend goes. */
  private refuse(fields: ErrorFields): void {
    this.backend.socket.destroy();
    if (!this.client.destroyed) this.client.end(errorResponse(fields), () => this.client.destroy());
    this.opts.onClose();
  }

  /** A backend lost because a newer leader's raise ended it: the writer hears FP409, as if its next statement had come after the raise. */
  private async lostReason(pair: FencePair | null, terminated: boolean): Promise<ErrorFields | null> {
    if (pair === null) return null;
    const highest = await this.opts.fence.raisedAbove(pair.fenceKey, pair.token, terminated ? this.opts.raiseCommitMs : 0);
    if (highest === null) return null;
    this.opts.onStale({ fenceKey: pair.fenceKey, token: pair.token, highestToken: highest });
    return revokedFields(pair.fenceKey, pair.token, highest);
  }
}
